"""The printed table of ``python -m benchmarks relay`` (:mod:`benchmarks.relay_bench`)."""

from __future__ import annotations

from typing import Any


def _cores(used: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.2f}" for name, value in used.items())


def print_table(result: dict[str, Any]) -> None:
    rounds = result["rounds"]
    rows = [
        ("events", f"{result['events']:,}"),
        ("outbox tables (one slot)", str(result.get("outboxes", 1))),
        ("txn size", str(result["txn_size"])),
        ("delivery", result["delivery"]),
        (
            f"raw drain (receive only), median of {len(rounds)}",
            f"{result['raw_drain_eps']:,.0f} events/s",
        ),
        ("relay into Kafka (acked/committed), median", f"{result['relay_eps']:,.0f} events/s"),
        ("ratio relay/raw (median of the rounds')", f"{result['ratio']:.2f}"),
        ("ratio relay/raw per round", ", ".join(f"{r['ratio']:.2f}" for r in rounds)),
        ("relay warm-up (no round's)", f"{result['warmup_relay_eps']:,.0f} events/s"),
        ("relay process CPU per event, median", f"{result['relay_thread_us_per_event']:.1f} us"),
        ("records in Kafka (fewest of a round)", f"{result['records_in_kafka']:,}"),
        ("cores used, raw phase (median round)", _cores(result["cores_raw_phase"])),
        ("cores used, relay phase (median round)", _cores(result["cores_relay_phase"])),
        ("peak RSS", f"{result['peak_rss_mb']} MB"),
    ]
    if "avro_relay_eps" in result:
        rows[6:6] = [
            ("relay, Avro values (median)", f"{result['avro_relay_eps']:,.0f} events/s"),
            (
                "ratio Avro/JSON relay (median)",
                f"{result['avro_vs_json']:.2f} of "
                + ", ".join(f"{p['ratio']:.2f}" for p in result["avro_rounds"]),
            ),
            ("Avro relay process CPU/event", f"{result['avro_relay_thread_us_per_event']:.1f} us"),
        ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(
        f"\n{'round':>5}  {'first':>5}  {'raw ev/s':>9}  {'relay ev/s':>10}  {'ratio':>5}  us/event"
    )
    for n, r in enumerate(rounds):
        first = "raw" if r["raw_first"] else "relay"
        print(
            f"{n:>5}  {first:>5}  {r['raw_eps']:>9,.0f}  {r['relay_eps']:>10,.0f}"
            f"  {r['ratio']:>5.2f}  {r['relay_thread_us_per_event']:>8.1f}"
        )
