"""``python -m benchmarks relay --outboxes 3`` measures the stream (issue 38): the slots it
sets up record every outbox table as streamed, as ``cdc-outbox init`` does, so the relay
does not catch tables 2 and 3 up from the tables first (cdc/new_tables.py: an unknown record
means "the first configured outbox only")."""

from __future__ import annotations

from benchmarks.relay_bench import _tables, setup
from cdc_outbox.cdc.relay_build import new_tables_of
from cdc_outbox.config.settings import Settings
from cdc_outbox.store.relay_state import streamed_tables


def test_every_outbox_table_of_the_benchmark_slots_is_streamed_from_the_start(
    pg_dsn: str,
) -> None:
    settings = Settings.model_validate(
        {"dsn": pg_dsn, "slot_name": "bench_relay0", **_tables(3, "bench.1")}
    )
    setup(settings, ["bench_raw0", "bench_relay0"], ["bench_relay0"])
    names = [o.name for o in settings.outbox_settings()]
    assert streamed_tables(settings) == dict.fromkeys(names, 0)
    # Nothing to catch up: the relay streams all three (no delivery needed to find that out).
    assert new_tables_of(settings).catch_up(None, [], None, None) == {}  # type: ignore[arg-type]
