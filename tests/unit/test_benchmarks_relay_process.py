"""The benchmarks run the relay as its own process (issue 38 item 1): the settings a phase
builds reach ``python -m cdc_outbox run`` intact through ``CDC_OUTBOX_*`` variables."""

from __future__ import annotations

import pytest

from benchmarks.relay_process import phase_topics, settings_env, settings_values
from cdc_outbox.config.settings import Settings


def _phase_settings() -> Settings:
    return Settings.model_validate(
        {
            "dsn": "host=127.0.0.1 port=5999 user=postgres dbname=postgres",
            "mode": "cdc",
            "delivery": "exactly_once",
            "eos": {"checkpoint_topic": "bench.1.checkpoints", "commit_interval_ms": 250},
            "slot_name": "bench_compare",
            "publication_name": "bench_compare_pub",
            "outbox_table": "bench_compare_outbox",
            "topic_template": "bench.1.cdc.{aggregate_type}",
            "metrics_port": 0,
            "cdc_mark_published": "delete",
            "slot_failover": False,
            "kafka": {"bootstrap_servers": "127.0.0.1:9999", "config": {"linger.ms": "5"}},
        }
    )


def test_the_relay_process_reads_the_phase_settings_from_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wanted = _phase_settings()
    env = settings_env(settings_values(wanted))
    assert env["CDC_OUTBOX_KAFKA__CONFIG"] == '{"linger.ms": "5"}'
    assert env["CDC_OUTBOX_SLOT_FAILOVER"] == "false"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    got = Settings()
    assert got.model_dump() == wanted.model_dump()
    assert got.dsn.get_secret_value() == wanted.dsn.get_secret_value()


def test_phase_topics_are_the_template_per_aggregate_type() -> None:
    assert phase_topics(_phase_settings()) == ["bench.1.cdc.order"]


def test_the_three_outbox_variant_reaches_the_relay_with_each_rounds_topics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``relay --outboxes 3``: three [[outboxes]] tables, each round's relay with topics of its
    own per table, all of them watched by the phase's consumer."""
    from benchmarks.relay_bench import _tables
    from benchmarks.relay_rounds import topic_prefix, with_topics

    base = Settings.model_validate(
        {"dsn": "postgresql://u@h/db", "slot_name": "s0", **_tables(3, "bench.1", "delete")}
    )
    phase = with_topics(base, topic_prefix(2, 7), slot_name="bench_relay2")
    assert [o.table for o in phase.outbox_settings()] == [f"bench_outbox_{n}" for n in (1, 2, 3)]
    assert phase.slot_name == "bench_relay2"
    assert {o.cdc_mark_published for o in phase.outbox_settings()} == {"delete"}
    assert phase_topics(phase) == [f"bench-r2.7.o{n}.order" for n in (1, 2, 3)]
    assert phase_topics(base) == [f"bench.1.o{n}.order" for n in (1, 2, 3)]  # unchanged
    single = with_topics(Settings.model_validate({"dsn": "postgresql://u@h/db"}), "bench-r0.7")
    assert phase_topics(single) == ["bench-r0.7.order"]
    for name, value in settings_env(settings_values(phase)).items():
        monkeypatch.setenv(name, value)
    got = Settings()  # type: ignore[call-arg]  # (the environment gives the rest)
    assert got.outbox_settings() == phase.outbox_settings()


def test_latency_from_outside_is_per_event_from_the_commit_and_counts_only_the_measured() -> None:
    from benchmarks.outside_latency import quantiles

    committed = {"a": 100.0, "b": 100.0, "old": 90.0, "lost": 100.0}
    seen = {"a": 100.010, "b": 100.030, "old": 95.0}
    q = quantiles(committed, seen, since=99.0)
    assert q["events"] == 2  # "old" committed before the window, "lost" never seen
    assert q["max"] == 30.0 and q["p50"] == 10.0


def test_issue_38_latency_targets_are_against_each_rounds_floor() -> None:
    from benchmarks.latency_report import targets

    def round_(alo: float, eos: float, floor: float, e2e: float) -> dict[str, object]:
        return {
            "cdc": {"latency_ms": {"p99": alo}},
            "cdc_eos": {"latency_ms": {"p99": eos}},
            "floor": {"legs_ms": {"commit_received": {"p99": floor}}},
            "e2e": {"e2e_latency_ms": {"p99": e2e}, "latency_ms": {"p99": alo}},
        }

    t = targets([round_(30.0, 40.0, 25.0, 45.0), round_(50.0, 60.0, 30.0, 70.0)])
    assert t["alo_over_floor_p99_ms_rounds"] == [5.0, 20.0]
    assert t["alo_over_floor_p99_ms"] == 12.5 and not t["alo_met"]
    assert t["e2e_floor_p99_ratio_rounds"] == [1.8, 2.33]
    assert t["e2e_floor_p99_ratio"] == 2.07 and not t["e2e_met"]
