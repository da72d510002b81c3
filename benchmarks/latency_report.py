"""Report of the moderate-load latency phases (:mod:`benchmarks.latency_phases`): the table,
the issue 25 targets and whether they are met. No imports of the other benchmark modules."""

from __future__ import annotations

import statistics
from typing import Any

#: Issue 38: the at-least-once p99 at most this many ms above the floor's p99 (median of the
#: rounds' differences), the end-to-end p99 at most this many times the floor's.
ALO_OVER_FLOOR_MAX_MS, E2E_FLOOR_RATIO_MAX = 10.0, 2.0
#: Exactly-once commit->visible p99 at most this times the at-least-once p99 of the same run.
EOS_P99_RATIO_MAX = 2.0
QUANTILES = ("p50", "p95", "p99")
#: The load: PostgreSQL transactions/s and outbox rows per transaction.
TXNS_PER_S, TXN_ROWS = 20, 100


def targets(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets over ``rounds`` (each ``{"cdc": phase, "cdc_eos": phase}``): medians of the
    rounds' p99s and of their EOS/ALO ratios."""
    ratios = [r["cdc_eos"]["latency_ms"]["p99"] / r["cdc"]["latency_ms"]["p99"] for r in rounds]
    alo_p99 = round(statistics.median(r["cdc"]["latency_ms"]["p99"] for r in rounds), 1)
    ratio = statistics.median(ratios)
    out: dict[str, Any] = {
        "alo_p99_ms": alo_p99,
        "eos_alo_p99_ratio": round(ratio, 2),
        "eos_alo_p99_ratio_rounds": [round(r, 2) for r in ratios],
        "eos_ratio_max": EOS_P99_RATIO_MAX,
        "eos_met": ratio <= EOS_P99_RATIO_MAX,
    }
    floors = [floor_p99(r) for r in rounds if "floor" in r]
    if floors:
        out["floor_p99_ms"] = round(statistics.median(floors), 1)
        over = [r["cdc"]["latency_ms"]["p99"] - floor_p99(r) for r in rounds]
        out["alo_over_floor_p99_ms"] = round(statistics.median(over), 1)
        out["alo_over_floor_p99_ms_rounds"] = [round(v, 1) for v in over]
        out["alo_over_floor_max_ms"] = ALO_OVER_FLOOR_MAX_MS
        out["alo_met"] = statistics.median(over) <= ALO_OVER_FLOOR_MAX_MS
        e2e = [r["e2e"]["e2e_latency_ms"]["p99"] / floor_p99(r) for r in rounds if "e2e" in r]
        if e2e:
            out["e2e_floor_p99_ratio"] = round(statistics.median(e2e), 2)
            out["e2e_floor_p99_ratio_rounds"] = [round(v, 2) for v in e2e]
            out["e2e_floor_ratio_max"] = E2E_FLOOR_RATIO_MAX
            out["e2e_met"] = statistics.median(e2e) <= E2E_FLOOR_RATIO_MAX
    return out


def floor_p99(pair: dict[str, Any]) -> float:
    """The round's floor: PostgreSQL commit to its Commit message received by a raw drain, p99
    (:mod:`benchmarks.latency_floor`)."""
    return float(pair["floor"]["legs_ms"]["commit_received"]["p99"])


def rows(section: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """One row per round and quantile: at-least-once, exactly-once, EOS/ALO."""
    out = []
    for n, pair in enumerate(section["rounds"], 1):
        for q in QUANTILES:
            a, e = pair["cdc"]["latency_ms"][q], pair["cdc_eos"]["latency_ms"][q]
            out.append((f"round {n}: latency {q} (ms)", f"{a:,.1f}", f"{e:,.1f}", f"{e / a:.2f}x"))
        if "floor" in pair:
            floor = pair["floor"]["legs_ms"]["commit_received"]
            for q in ("p50", "p99"):
                out.append((f"round {n}: floor {q} (ms), no relay", f"{floor[q]:,.1f}", "", ""))
            a, e = pair["cdc"]["latency_ms"]["p99"], pair["cdc_eos"]["latency_ms"]["p99"]
            f = floor["p99"]
            label = f"round {n}: p99 minus floor p99 (ms)"
            out.append((label, f"{a - f:,.1f}", f"{e - f:,.1f}", ""))
        if "e2e" in pair:
            e2e, rel = pair["e2e"]["e2e_latency_ms"], pair["e2e"]["latency_ms"]
            for q in ("p50", "p99"):
                out.append(
                    (
                        f"round {n}: end to end {q} (ms): commit -> applied by `cdc-outbox"
                        f" consume` (relay's commit -> visible {rel[q]:,.1f})",
                        f"{e2e[q]:,.1f}",
                        "",
                        "",
                    )
                )
    return out


def summary(section: dict[str, Any]) -> list[str]:
    """The targets, met or not, one line each."""
    t = section["targets"]
    lines = []
    if "alo_met" in t:
        over = ", ".join(f"{v:.1f}" for v in t["alo_over_floor_p99_ms_rounds"])
        lines.append(
            f"- At-least-once p99 <= floor p99 + {t['alo_over_floor_max_ms']:.0f} ms:"
            f" {'met' if t['alo_met'] else 'NOT met'} ({t['alo_p99_ms']} ms; p99 minus the"
            f" round's floor p99: {over} ms, median {t['alo_over_floor_p99_ms']})."
        )
    if "e2e_met" in t:
        lines.append(
            f"- End-to-end p99 (writer commit -> applied by `cdc-outbox consume`, de-duplication"
            f" on) <= {t['e2e_floor_ratio_max']:.0f}x the floor p99:"
            f" {'met' if t['e2e_met'] else 'NOT met'} (median"
            f" {t['e2e_floor_p99_ratio']:.2f}x; rounds"
            f" {', '.join(f'{v:.2f}' for v in t['e2e_floor_p99_ratio_rounds'])})."
        )
    if "floor_p99_ms" in t:
        lines.append(
            f"- Floor (no relay: PostgreSQL commit to its Commit message received by a raw drain"
            f" of the slot, same writers and load): p99 {t['floor_p99_ms']} ms, median of the"
            " rounds; no relay acknowledges a transaction before that."
        )
    lines.append(
        f"- Exactly-once p99 <= {t['eos_ratio_max']:.0f}x the at-least-once p99 of the same"
        f" round: {'met' if t['eos_met'] else 'NOT met'} ({t['eos_alo_p99_ratio']:.2f}x, median"
        f" of {', '.join(f'{r:.2f}' for r in t['eos_alo_p99_ratio_rounds'])})."
    )
    return lines


def print_section(section: dict[str, Any]) -> None:
    table = [("moderate load (20 txns/s x 100 rows)", "at-least-once", "exactly-once", "EOS/ALO")]
    table += rows(section)
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    for r in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))
    for line in summary(section):
        print(line)


def markdown(section: dict[str, Any]) -> list[str]:
    """The Markdown report's section."""
    p = section["params"]
    return [
        "## Latency at moderate load: exactly-once vs at-least-once",
        "",
        f"{p['txns_per_s']} PostgreSQL transactions/s of {p['txn_rows']} outbox rows"
        f" ({p['writers']} writers) with the relay running, {p['warmup_s']:.0f} s unmeasured,"
        f" then {p['seconds']:.0f} s measured, one phase per delivery in each round (the first"
        " alternates), then a floor phase at the same load with no relay, the slot read by a"
        " raw drain (`benchmarks/latency_floor.py`), and an end-to-end phase: at-least-once with"
        " `cdc-outbox consume` (de-duplication on, a no-op handler) running too. The relay and"
        " the consumer run as processes of their own; latency is measured from outside, per"
        " event, from the writer's commit (its business row's commit timestamp) to the record"
        " received by a read_committed consumer of the topic (the relay's commit -> visible),"
        " or to the commit of the event's processed_events row (end to end)"
        " (`benchmarks/outside_latency.py`).",
        "",
        "| metric | at-least-once | exactly-once | EOS/ALO |",
        "|---|---:|---:|---:|",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows(section)),
        "",
        *summary(section),
        "",
    ]
