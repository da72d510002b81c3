"""``python -m benchmarks debezium``'s plumbing that needs no JVM and no server: the Kafka
Connect and Debezium properties it renders (the connector publishes what cdc-outbox's settings
publish), the coordinates it fetches, and the figures it derives from commit and append times."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from benchmarks import debezium_floor, debezium_report, debezium_setup
from benchmarks.debezium_readers import peak_rss_mb
from cdc_outbox.config.settings import Settings
from cdc_outbox.debezium.config_import import convert
from cdc_outbox.debezium.files import parse_properties
from cdc_outbox_dev.sandbox import kafka_connect
from cdc_outbox_dev.sandbox.kafka_jars import KAFKA_VERSION

DSN = "host=127.0.0.1 port=5433 user=postgres dbname=shop"
NAMES = {"slot": "s1", "publication": "p1", "table": "outbox_t", "topic_prefix": "dbz.1.x"}


def _connector(tuning: dict[str, str]) -> dict[str, str]:
    return parse_properties(debezium_setup.connector_properties(DSN, tuning=tuning, **NAMES))


@pytest.mark.parametrize("variant", sorted(debezium_setup.VARIANTS))
def test_the_connector_publishes_what_cdc_outbox_publishes(variant: str) -> None:
    """cdc-outbox's own import of the rendered connector gives the settings the benchmark runs
    cdc-outbox with: same table, slot, publication, topic, key and value."""
    props = _connector(debezium_setup.VARIANTS[variant])
    imported = convert(props).settings
    ours = tomllib.loads(debezium_setup.relay_toml(DSN, "127.0.0.1:9092", **NAMES))
    for key in ("slot_name", "publication_name", "outbox_table", "topic_template"):
        assert imported[key] == ours[key], key
    assert imported["columns"] == ours["columns"] == {"preset": "debezium"}
    assert conninfo_to_dict(imported["dsn"]) == conninfo_to_dict(DSN)
    settings = Settings.model_validate(ours)
    assert settings.kafka_config()["bootstrap.servers"] == "127.0.0.1:9092"
    assert settings.metrics_port == 0
    assert settings.leader_lease_s == 60  # survives the warm drain's pause
    # Debezium creates and drops nothing, and snapshots nothing: it streams the given slot.
    assert props["publication.autocreate.mode"] == "disabled"
    assert props["snapshot.mode"] == "no_data"
    assert props["transforms.outbox.type"] == "io.debezium.transforms.outbox.EventRouter"


def test_defaults_are_debezium_as_shipped_and_tuned_sets_each_documented_key() -> None:
    default = _connector(debezium_setup.VARIANTS["debezium_default"])
    assert not set(default) & set(debezium_setup.DEFAULTS)
    tuned = _connector(debezium_setup.TUNED)
    assert set(debezium_setup.TUNED) == set(debezium_setup.DEFAULTS)
    for key, value in debezium_setup.TUNED.items():
        if key.startswith("producer."):
            assert key not in tuned  # a worker setting
        else:
            assert tuned[key] == value != debezium_setup.DEFAULTS[key]
    assert int(tuned["max.queue.size"]) > int(tuned["max.batch.size"])  # Debezium requires it


def test_worker_properties_listen_on_loopback_and_take_the_producer_tuning() -> None:
    text = debezium_setup.worker_properties("127.0.0.1:9092", 18083, debezium_setup.TUNED)
    worker = parse_properties(text.format(plugin_path="/p", offsets="/o/offsets.dat"))
    assert worker["listeners"] == "http://127.0.0.1:18083"
    assert worker["bootstrap.servers"] == "127.0.0.1:9092"
    assert (worker["plugin.path"], worker["offset.storage.file.filename"]) == (
        "/p",
        "/o/offsets.dat",
    )
    assert worker["producer.linger.ms"] == debezium_setup.TUNED["producer.linger.ms"]
    assert worker["producer.batch.size"] == debezium_setup.TUNED["producer.batch.size"]
    assert "max.batch.size" not in worker
    plain = debezium_setup.worker_properties("127.0.0.1:9092", 1, {})
    assert "producer." not in plain


def test_properties_escape_backslashes() -> None:
    text = debezium_setup.render_properties({"a.b": "x\\y", "c": "${routedByValue}"})
    assert parse_properties(text) == {"a.b": "x\\y", "c": "${routedByValue}"}


def test_connect_and_debezium_come_from_maven_at_the_brokers_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[Any, ...]] = []

    def fetch(home: Path, name: str, what: str, goal: list[str], artifact: str, **kw: Any) -> Path:
        calls.append((home.name, name, goal, artifact, kw))
        return tmp_path / name

    monkeypatch.setattr(kafka_connect, "maven_fetch", fetch)
    assert kafka_connect.ensure_connect() == (tmp_path / "jars", tmp_path / "plugin")
    (home1, _, _, jar, kw1), (home2, _, goal2, tarball, kw2) = calls
    assert (
        home1 == f"kafka-connect-{KAFKA_VERSION}" and jar == f"connect-runtime-{KAFKA_VERSION}.jar"
    )
    assert f"<artifactId>connect-runtime</artifactId>\n      <version>{KAFKA_VERSION}" in kw1["pom"]
    version = kafka_connect.DEBEZIUM_VERSION
    assert home2 == f"debezium-{version}" and kw2 == {"extract": True}
    assert f"-Dartifact=io.debezium:debezium-connector-postgres:{version}:tar.gz:plugin" in goal2
    assert tarball == f"debezium-connector-postgres-{version}-plugin.tar.gz"


def test_latencies_count_each_event_once_from_its_commit() -> None:
    commits = {f"e{i}": 1000.0 + i for i in range(100)}
    # e0..e98 appended 5 ms after their commit, e99 after 50 ms; e3 twice (a retry), one
    # record of an event not in this phase
    appends = [(f"e{i}", int(1005 + i)) for i in range(99)] + [("e99", 1149), ("e3", 9999)]
    appends.append(("other", 1))
    got = debezium_report.latencies(commits, appends)
    assert got["latency_ms"] == {"p50": 5.0, "p99": 5.0, "max": 50.0}
    assert (got["events"], got["records"], got["unmatched"]) == (100, 102, 1)
    with pytest.raises(ValueError, match="no record matched"):
        debezium_report.latencies(commits, [("other", 1)])


def test_warm_drain_runs_from_the_resume_to_the_last_append() -> None:
    commits = {"a": 10_000.0, "b": 10_500.0, "c": 11_000.0}
    appends = [("a", 12_100), ("c", 14_000), ("b", 13_000)]
    got = debezium_report.warm_result(commits, appends, 1.5, resumed_ms=11_000.0)
    assert got["drain_s"] == 3.0 and got["events_per_s"] == 1.0
    assert got["commit_span_s"] == 1.0
    assert (got["events"], got["records"], got["cpu_s"]) == (3, 3, 1.5)


def test_cold_drain_runs_from_the_process_start_to_the_last_append() -> None:
    # started at t=100 s; the first of 1,001 records appended at 104 s, the last at 105 s
    appends = [105_000, 104_000, *(104_500 for _ in range(999))]
    got = debezium_report.cold_result(100.0, 1001, appends, 7.0)
    assert (got["start_s"], got["drain_s"], got["total_s"]) == (4.0, 1.0, 5.0)
    assert got["events_per_s"] == 200.2  # 1,001 events in 5 s, start-up included
    assert got["after_first_events_per_s"] == 1000.0
    assert (got["records"], got["cpu_s"]) == (1001, 7.0)


def test_median_tree_takes_each_numbers_median() -> None:
    rounds = [
        {"a": {"x": 1.0, "n": 3, "load": ["l1"], "ok": True}, "b": "text1"},
        {"a": {"x": 5.0, "n": 1, "load": ["l2"], "ok": False}, "b": "text2"},
        {"a": {"x": 2.0, "n": 2, "load": ["l3"], "ok": False}, "b": "text3"},
    ]
    got = debezium_report.median_tree(rounds)
    assert got == {"a": {"x": 2.0, "n": 2, "load": ["l1"], "ok": True}, "b": "text1"}


def _side(warm: float, p99: float, cpu: float) -> dict[str, Any]:
    latency = {"latency_ms": {"p50": 1.0, "p99": p99}, "cpu_s": cpu, "offered_txns_per_s": 20.0}
    return {
        "warm": {"events_per_s": warm, "cpu_s": cpu, "events": 100},
        "latency_20x100": {**latency, "cores_used": 0.1},
        "latency_2000x1": {**latency, "cores_used": 0.2, "latency_ms": {"p50": 2.0, "p99": 9.0}},
        "peak_rss_mb": 100.0,
    }


def _cold(rate: float) -> dict[str, Any]:
    return {
        "events_per_s": rate,
        "after_first_events_per_s": rate * 2,
        "start_s": 1.0,
        "cpu_s": 2.0,
        "peak_rss_mb": 50.0,
    }


def test_summary_compares_cdc_outbox_with_debezium_tuned() -> None:
    result: dict[str, Any] = {
        "cold": {
            "cdc_outbox": _cold(300),
            "debezium_default": _cold(1),
            "debezium_tuned": _cold(100),
        },
        "running": {
            "cdc_outbox": _side(warm=200, p99=10, cpu=1),
            "debezium_default": _side(warm=1, p99=1, cpu=1),
            "debezium_tuned": _side(warm=100, p99=20, cpu=4),
        },
    }
    result["summary"] = got = debezium_report.summarize(result)
    assert (got["warm_throughput"], got["p99_20x100"], got["cpu"]) == (2.0, 0.5, 0.25)
    assert got["cold_throughput"] == 3.0
    assert got["met"] == {"warm_throughput": True, "p99_20x100": True, "cpu": True}
    assert got["cpu_by_phase"] == dict.fromkeys(("warm", "latency_20x100", "latency_2000x1"), 0.25)
    result["running"]["cdc_outbox"] = _side(warm=199, p99=10.1, cpu=1.01)
    result["summary"] = got = debezium_report.summarize(result)
    assert got["met"] == {"warm_throughput": False, "p99_20x100": False, "cpu": False}
    printed = debezium_report.table(result)
    # rounds: each ratio is the median of the rounds' ratios
    slow = _side(warm=100, p99=40, cpu=8)
    result["rounds"] = [
        {**result["running"], "cdc_outbox": _side(warm=400, p99=10, cpu=1)},
        {**result["running"], "cdc_outbox": _side(warm=300, p99=10, cpu=1)},
        {**result["running"], "cdc_outbox": slow},
    ]
    got = debezium_report.summarize(result)
    assert (got["warm_throughput"], got["p99_20x100"], got["cpu"]) == (3.0, 0.5, 0.25)
    assert [r["warm_throughput"] for r in got["rounds"]] == [4.0, 3.0, 1.0]
    assert printed.splitlines()[0].split() == ["figure", *result["running"]]
    assert "warm drain 1.99x (target >= 2x: NOT met)" in printed
    result["machine"] = {"load_at_start": [3.25, 1.0, 1.0], "date": "2026-12-04 23:00 UTC"}
    row = debezium_report.results_row(result, "abc1234")
    assert row.startswith("| `debezium` |") and row.endswith("| 2026-12-04 23:00 UTC | abc1234 |")
    assert "warm drain **1.99\u00d7** (199 vs 100 events/s)" in row
    assert (
        "p99 at 20 \u00d7 100 **0.505\u00d7** (10.1 vs 20.0 ms)" in row
        and "; NOT met: warm drain, p99, CPU;" in row
    )
    assert "load average 3.2 at start" in row and "--rounds" not in row
    result["params"] = {"events": 100_000}
    assert "cold and warm 100,000-event drains" in debezium_report.results_row(result, "a")


def test_the_rows_verdict_names_each_target() -> None:
    met = {"warm_throughput": True, "p99_20x100": False, "cpu": False}
    assert debezium_report._verdict(met) == "met: warm drain; NOT met: p99, CPU"
    assert debezium_report._verdict(dict.fromkeys(met, True)) == "met: warm drain, p99, CPU"


def test_the_row_replaces_this_benchmarks_row_of_results_md(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text("| a |\n| `debezium` | old |\n| `debezium-x` | kept |\n")
    debezium_report.write_results_row(path, "| `debezium` | new |")
    assert path.read_text() == "| a |\n| `debezium` | new |\n| `debezium-x` | kept |\n"
    path.write_text("| a |\n")
    with pytest.raises(ValueError, match="found 0"):
        debezium_report.write_results_row(path, "| `debezium` | new |")


def test_peak_rss_reads_the_process_tree() -> None:
    assert 5 < peak_rss_mb(os.getpid()) < 4096


def test_the_floor_of_each_round_gives_each_systems_p99_over_it() -> None:
    result: dict[str, Any] = {
        "cold": {s: _cold(100) for s in ("cdc_outbox", "debezium_default", "debezium_tuned")},
        "rounds": [
            {
                "cdc_outbox": _side(warm=200, p99=30, cpu=1),
                "debezium_default": _side(warm=1, p99=900, cpu=1),
                "debezium_tuned": _side(warm=100, p99=50, cpu=4),
            }
        ]
        * 3,
        "floors": [
            {"transactions": 600, "latency_ms": {"p50": 2.0, "p99": p99, "max": 60.0}}
            for p99 in (8.0, 12.0, 10.0)
        ],
    }
    result["running"] = debezium_report.median_tree(result["rounds"])
    result["summary"] = got = debezium_report.summarize(result)
    assert got["floor_p99_20x100"] == 10.0
    assert got["over_floor_p99_20x100"] == {"cdc_outbox": 20.0, "debezium_tuned": 40.0}
    assert [r["over_floor_p99_20x100"]["cdc_outbox"] for r in got["rounds"]] == [22.0, 18.0, 20.0]
    assert got["p99_20x100"] == 0.6 and got["met"]["p99_20x100"] is False
    printed = debezium_report.table(result)
    assert (
        "floor (PostgreSQL alone) p99 at 20x100 10.0 ms; p99 minus the floor: cdc-outbox 20.0 ms,"
        " Debezium tuned 40.0 ms" in printed
    )
    result["machine"] = {"load_at_start": [1.0, 1.0, 1.0], "date": "2026-12-05 05:00 UTC"}
    row = debezium_report.results_row(result, "abc1234")
    assert "p99 at 20 \u00d7 100 10.0 ms, p99 over it 20.0 vs 40.0 ms; cold drain" in row


def test_the_floor_is_commit_received_minus_commit_per_transaction() -> None:
    # (commit, sent, Begin received, Commit received), seconds
    times = [(100.0, 100.001, 100.002, 100.0 + ms / 1000) for ms in range(1, 101)]
    got = debezium_floor.latencies(times)
    assert got["transactions"] == 100
    assert got["latency_ms"] == {"p50": 50.0, "p99": 99.0, "max": 100.0}
    with pytest.raises(ValueError, match="no transaction"):
        debezium_floor.latencies([])
