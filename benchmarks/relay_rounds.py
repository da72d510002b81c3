"""Raw slot drain vs relay in rounds: the core of ``relay`` (``--rounds``, default 6).

Every slot (a raw and a relay slot per round) is created at the same point, before the data is
written, so every phase reads exactly the same WAL. A round is a raw drain and a relay phase
back to back, the raw drain first in even rounds and the relay first in odd ones: the order
matters (in five of six five-round runs on a loaded machine, 2026-12-04, the relay-first
rounds had the lower mean ratio: a relay right after the restore and the previous relay phase
ran slower), so an even count has as many rounds of each order.
The reported ``ratio`` is the median of the rounds' relay/raw ratios: a single pair is at the
mercy of whatever else the two cores do at that moment.

Before every round the outbox table (each, with ``--outboxes``) is put back to the state the data
was written in: its rows are copied once after the write (an unlogged table) and restored with
``TRUNCATE`` + ``INSERT``,
after a ``CHECKPOINT`` (if allowed), then ``VACUUM ANALYZE``. Without that, the relay of a later
round would mark rows an earlier one already marked PUBLISHED (or deleted): no row would change
and its PostgreSQL cost would be far lower than the first round's. The restore's WAL comes after
the data, so no timed phase reads it (a relay may read into it after its last counted event).

Before the rounds, the relay runs once unmeasured on a slot of its own (``warmup_relay_eps``):
the first load on a fresh broker runs far slower than the later ones (0.33 against 0.48-0.58
in the first five-round run, 2026-12-04), which would only favour the raw drain of round 0.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from cdc_outbox.config.settings import Settings
from cdc_outbox.store.schema import outbox_ident
from cdc_outbox_dev.readback import count_records

if TYPE_CHECKING:
    from benchmarks.relay_bench import RelayRun

#: The unlogged copy of an outbox table's written rows that every round starts from.
COPY_SUFFIX = "_rows"


#: The warm-up relay's slot: it relays the data once before the rounds, unmeasured.
WARMUP_SLOT = "bench_relay_warmup"


def slots(rounds: int) -> list[tuple[str, str]]:
    """``(raw slot, relay slot)`` of every round."""
    return [(f"bench_raw{n}", f"bench_relay{n}") for n in range(rounds)]


def topic_prefix(number: int, stamp: int) -> str:
    """The topics of round ``number``'s relay (-1: the warm-up's; none is a prefix of
    another's)."""
    return f"bench-r{number}.{stamp}" if number >= 0 else f"bench-warmup.{stamp}"


def topic_template(prefix: str, outbox: int, outboxes: int) -> str:
    """The topic template of outbox number ``outbox`` of ``outboxes`` in a phase: one outbox
    writes to ``PREFIX.{aggregate_type}``, several each to ``PREFIX.oN.{aggregate_type}``."""
    return (
        f"{prefix}.o{outbox + 1}.{{aggregate_type}}"
        if outboxes > 1
        else f"{prefix}.{{aggregate_type}}"
    )


def with_topics(settings: Settings, prefix: str, **update: Any) -> Settings:
    """``settings`` with ``update`` and every outbox's topics under ``prefix``
    (:func:`topic_template`)."""
    if not settings.outboxes:
        return settings.model_copy(
            update={**update, "topic_template": topic_template(prefix, 0, 1)}
        )
    n = len(settings.outboxes)
    outboxes = [
        o.model_copy(update={"topic_template": topic_template(prefix, i, n)})
        for i, o in enumerate(settings.outboxes)
    ]
    return settings.model_copy(update={**update, "outboxes": outboxes})


def _copies(settings: Settings) -> list[tuple[sql.Identifier, sql.Identifier]]:
    """(outbox table, the copy of its written rows) of every outbox."""
    return [
        (outbox_ident(settings, o), sql.Identifier(o.schema_name, o.table + COPY_SUFFIX))
        for o in settings.outbox_settings()
    ]


def keep_rows(settings: Settings) -> None:
    """Copy the written outbox rows, as they are now (all PENDING), for :func:`restore`."""
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        for table, copy in _copies(settings):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(copy))
            conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} AS TABLE {}").format(copy, table))


def restore(settings: Settings) -> None:
    """Put each outbox table back to the rows :func:`keep_rows` copied, vacuumed and analysed
    (no autovacuum then runs on it during the round), after a checkpoint (skipped without the
    privilege): every round's pages are then dirtied after the last checkpoint, as a relay's
    marking finds rows inserted a moment before, and no round pays full-page images that
    another does not."""
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")
        with conn.transaction():
            for table, copy in _copies(settings):
                conn.execute(sql.SQL("TRUNCATE {}").format(table))
                conn.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(table, copy))
        for table, _copy in _copies(settings):
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))


def run(
    settings: Settings,
    bootstrap: str,
    rounds: int,
    stamp: int,
    events: int,
    raw: Callable[[str], tuple[float, int, dict[str, float]]],
    relay: Callable[[Settings, int], RelayRun],
) -> dict[str, Any]:
    """Run ``rounds`` rounds: ``raw(slot)`` gives (seconds, frames, cores) of a raw drain,
    ``relay(settings, round)`` a :class:`RelayRun`. Returns the benchmark's medians and
    ``rounds`` (every round's figures)."""
    keep_rows(settings)
    warmups = len(settings.outbox_settings())  # warm-up records: one per outbox's topic
    per_round: list[dict[str, Any]] = []
    warmup: RelayRun | None = None
    for number, (raw_slot, relay_slot) in [(-1, ("", WARMUP_SLOT)), *enumerate(slots(rounds))]:
        restore(settings)
        prefix = topic_prefix(number, stamp)
        phase = with_topics(settings, prefix, slot_name=relay_slot)
        if number < 0:
            warmup = relay(phase, number)
            continue
        raw_first = number % 2 == 0
        if raw_first:
            raw_s, frames, raw_cores = raw(raw_slot)
            relayed = relay(phase, number)
        else:
            relayed = relay(phase, number)
            raw_s, frames, raw_cores = raw(raw_slot)
        raw_eps, relay_eps = events / raw_s, events / relayed.seconds
        per_round.append(
            {
                "raw_eps": round(raw_eps, 1),
                "relay_eps": round(relay_eps, 1),
                "ratio": round(relay_eps / raw_eps, 3),
                "relay_thread_us_per_event": round(relayed.thread_cpu_s / events * 1e6, 2),
                "raw_first": raw_first,
                "raw_drain_s": round(raw_s, 3),
                "relay_s": round(relayed.seconds, 3),
                "start_s": round(relayed.start_s, 3),
                "raw_frames": frames,
                # Less the warm-up records (one a topic); a relay may read past its last
                # counted event into the restore's rows (more records, never fewer).
                "records_in_kafka": count_records(bootstrap, prefix) - warmups,
                "cores_raw_phase": raw_cores,
                "cores_relay_phase": relayed.cores,
            }
        )
    assert warmup is not None
    return {
        **summary(per_round),
        "warmup_relay_eps": round(events / warmup.seconds, 1),
    }


def summary(per_round: list[dict[str, Any]]) -> dict[str, Any]:
    """The benchmark's top-level figures: medians over the rounds (cores: those of the round
    with the median ratio, the lower one for an even count), ``rounds`` as given."""
    ratios = sorted(r["ratio"] for r in per_round)
    middle = next(r for r in per_round if r["ratio"] == ratios[(len(ratios) - 1) // 2])

    def median(field: str) -> float:
        return round(float(statistics.median(r[field] for r in per_round)), 3)

    return {
        "raw_drain_s": median("raw_drain_s"),
        "raw_drain_eps": median("raw_eps"),
        "raw_frames": per_round[0]["raw_frames"],
        "relay_s": median("relay_s"),
        "start_s": median("start_s"),
        "relay_eps": median("relay_eps"),
        "ratio": median("ratio"),
        "ratio_min": ratios[0],
        "ratio_max": ratios[-1],
        "relay_thread_us_per_event": median("relay_thread_us_per_event"),
        "records_in_kafka": min(r["records_in_kafka"] for r in per_round),
        "cores_raw_phase": middle["cores_raw_phase"],
        "cores_relay_phase": middle["cores_relay_phase"],
        "rounds": per_round,
    }
