"""Avro vs JSON values over the same WAL, in rounds: part of ``relay --value-format avro``.

Each round relays the same WAL once with each format, on slots of its own (every slot is
created at the same point, before the data is written), back to back, the first of the two
alternating: JSON first in even rounds, Avro first in odd ones (the default, 12 rounds, has
as many of each). The relay benchmark's own JSON phase runs before them and is no round's: it is
the first load on a fresh broker (in ten runs on 2026-12-01 it ran at 0.72 to 0.89 of the
later JSON phases' median: it favoured Avro in the round it was part of). The
reported ratio is the median of the rounds' Avro/JSON throughput ratios: a single pair is at
the mercy of whatever else the two cores do at that moment. Avro phases use a local Apicurio
registry and ``cdc_outbox_dev/schemas/OrderPlaced.avsc``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc_outbox.config.settings import Settings
from cdc_outbox_dev.readback import count_records

if TYPE_CHECKING:
    from benchmarks.relay_bench import RelayRun

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "cdc_outbox_dev" / "schemas"


def phases(rounds: int, stamp: int) -> list[tuple[int, str, str, str]]:
    """``(round, format, slot, topic prefix)`` of every phase, in the order they run."""
    out: list[tuple[int, str, str, str]] = []
    for number in range(rounds):
        for fmt in ("avro", "json") if number % 2 else ("json", "avro"):
            out.append((number, fmt, f"bench_relay_{fmt}{number}", f"bench-{fmt}{number}.{stamp}"))
    return out


def compare(
    settings: Settings,
    registry_url: str,
    bootstrap: str,
    plan: list[tuple[int, str, str, str]],
    events: int,
    relay: Callable[[Settings], RelayRun],
) -> dict[str, Any]:
    """Run ``plan`` (see :func:`phases`) with ``relay``. Returns the benchmark's ``avro_*``
    fields (medians) and ``avro_rounds`` (every pair)."""
    from cdc_outbox.avro.check import check_schemas

    registry = settings.schema_registry.model_copy(
        update={"url": registry_url, "schemas_dir": str(SCHEMAS_DIR), "auto_register": True}
    )
    runs: dict[tuple[int, str], tuple[RelayRun, int]] = {}
    for number, fmt, slot, prefix in plan:
        phase = settings.model_copy(
            update={
                "slot_name": slot,
                "topic_template": prefix + ".{aggregate_type}",
                "value_format": fmt,
                "schema_registry": registry,
            }
        )
        if fmt == "avro":
            # Registered before the timed phase, as `cdc-outbox schemas check` does before a
            # deploy; the relay still resolves the id itself, once.
            check_schemas(phase, {"OrderPlaced": f"{prefix}.order"})
        run = relay(phase)
        runs[(number, fmt)] = (run, count_records(bootstrap, prefix) - 1)
    pairs = []
    for number in sorted({n for n, _ in runs}):
        (j, j_records), (a, a_records) = runs[(number, "json")], runs[(number, "avro")]
        pairs.append(
            {
                "json_eps": round(events / j.seconds, 1),
                "avro_eps": round(events / a.seconds, 1),
                "ratio": round(j.seconds / a.seconds, 3),
                "json_first": number % 2 == 0,
                "json_thread_us_per_event": round(j.thread_cpu_s / events * 1e6, 2),
                "avro_thread_us_per_event": round(a.thread_cpu_s / events * 1e6, 2),
                "avro_start_s": round(a.start_s, 3),
                "json_records_in_kafka": j_records,
                "avro_records_in_kafka": a_records,
            }
        )
    first_avro = runs[(0, "avro")][0]
    return {
        "avro_relay_eps": statistics.median(p["avro_eps"] for p in pairs),
        "avro_vs_json": statistics.median(p["ratio"] for p in pairs),
        "avro_relay_thread_us_per_event": statistics.median(
            p["avro_thread_us_per_event"] for p in pairs
        ),
        "avro_records_in_kafka": min(p["avro_records_in_kafka"] for p in pairs),
        "json_rounds_records_in_kafka": min(p["json_records_in_kafka"] for p in pairs),
        "cores_avro_relay_phase": first_avro.cores,
        "cores_json_round_phase": runs[(0, "json")][0].cores,
        "avro_rounds": pairs,
    }
