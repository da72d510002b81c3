"""``python -m benchmarks relay --outboxes 3`` measures the stream (issue 38): the slots it
sets up record every outbox table as streamed, as ``cdc-outbox init`` does, so the relay
does not catch tables 2 and 3 up from the tables first (cdc/new_tables.py: an unknown record
means "the first configured outbox only")."""

from __future__ import annotations

from benchmarks.relay_bench import _tables, setup
from cdc_outbox.cdc.new_tables import NewTables
from cdc_outbox.config.cdc import cdc_relay_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.store.relay_state import record_streamed_tables, streamed_tables


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
    new_tables = NewTables(
        cdc_relay_section(settings).catch_up,
        OutboxTable.all_of(settings),
        streamed=lambda: streamed_tables(settings),
        record=lambda tables: record_streamed_tables(settings, tables),
    )
    assert new_tables.catch_up(None, [], None, None) == {}  # type: ignore[arg-type]
