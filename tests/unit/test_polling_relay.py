"""Pure parts of the polling relay: backoff with jitter, gap-free claims, configuration checks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.config import Settings
from cdc_outbox.errors import ConfigError
from cdc_outbox.polling.outcomes import backoff_delay
from cdc_outbox.polling.relay import PollingRelay
from cdc_outbox.polling.sql import advisory_namespace, build, gap_free


@given(
    failures=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0.001, max_value=100.0),
    extra=st.floats(min_value=0.0, max_value=10_000.0),
    rand=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_backoff_is_capped_exponential_times_jitter_in_half_to_one(
    failures: int, base: float, extra: float, rand: float
) -> None:
    cap = base + extra
    nominal = min(cap, base * 2.0 ** (failures - 1))
    delay = backoff_delay(failures, base, cap, rand)
    assert 0.5 * nominal <= delay <= nominal
    assert delay <= cap


def test_backoff_doubles_per_failure_until_the_cap() -> None:
    delays = [backoff_delay(n, 1.0, 10.0, 1.0 - 1e-12) for n in range(1, 7)]
    assert delays == pytest.approx([1.0, 2.0, 4.0, 8.0, 10.0, 10.0])
    assert backoff_delay(1, 1.0, 10.0, 0.0) == 0.5  # the lowest jitter halves it


@dataclass
class _R:
    aggregate_id: str
    rank: int


def test_gap_free_keeps_contiguous_ranks_per_aggregate() -> None:
    rows = [_R("a", 1), _R("b", 2), _R("a", 2), _R("c", 1), _R("a", 4), _R("b", 3), _R("c", 2)]
    keep, back = gap_free(rows)
    # "b" lacks rank 1 (a row SKIP LOCKED skipped): nothing of it may go before that row.
    assert keep == [_R("a", 1), _R("a", 2), _R("c", 1), _R("c", 2)]
    assert back == [_R("b", 2), _R("a", 4), _R("b", 3)]


@given(st.lists(st.tuples(st.sampled_from("xyz"), st.integers(1, 6)), unique=True))
def test_gap_free_partitions_and_kept_ranks_are_prefixes(pairs: list[tuple[str, int]]) -> None:
    rows = [_R(a, r) for a, r in pairs]
    keep, back = gap_free(rows)
    assert sorted(keep + back, key=rows.index) == rows
    for agg in "xyz":
        kept = sorted(r.rank for r in keep if r.aggregate_id == agg)
        assert kept == list(range(1, len(kept) + 1))
        # kept stops exactly at the first missing rank
        assert len(kept) + 1 not in {r.rank for r in rows if r.aggregate_id == agg}


def test_advisory_namespace_is_a_stable_int4_per_table() -> None:
    a = advisory_namespace("public", "outbox")
    assert a == advisory_namespace("public", "outbox")
    assert a != advisory_namespace("public", "outbox2")
    for table in ("outbox", "x", "a" * 63, "Ünïcode"):
        assert -(2**31) <= advisory_namespace("s", table) < 2**31


def _settings(**values: object) -> Settings:
    return Settings.model_validate({"dsn": "host=127.0.0.1 dbname=x", **values})


def test_debezium_preset_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ConfigError, match=r"polling mode needs the status columns.*debezium"):
        PollingRelay(_settings(columns={"preset": "debezium"}))


def test_relay_without_headers_column_builds_and_names_itself() -> None:
    relay = PollingRelay(_settings(columns={"headers": ""}), worker_id="w-1")
    assert relay.worker_id == "w-1" and relay.stats.mode == "polling"
    assert PollingRelay(_settings()).worker_id != PollingRelay(_settings()).worker_id


def test_sql_quotes_configured_names() -> None:
    settings = _settings(
        outbox_schema="App", outbox_table="OutBox", columns={"aggregate_id": "aggId"}
    )
    text = build(settings).claim.as_string(None)
    assert '"App"."OutBox"' in text and '"aggId"' in text
