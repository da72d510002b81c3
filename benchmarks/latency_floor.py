"""The floor under the relay's commit->ack latency at issue 25's load: the same writers and the
same outbox table, the slot read by a raw drain that does nothing with what it receives, no
relay and no producer (the broker, when running, idles).

    python -m benchmarks latency-floor [--rounds N] [--seconds S] [--json PATH] [--write-results]

Per transaction, from its commit timestamp (PostgreSQL's clock; the same host): ``sent``, the
walsender stamped its Begin (the XLogData send time); ``begin_received`` / ``commit_received``,
the drain received its Begin / Commit. No relay can acknowledge a transaction before it has
received its Commit, so ``commit_received`` bounds the relay's commit->ack latency from below.
Quantiles as :func:`benchmarks.compare_bench.latency_phase` takes them (per event: every
transaction has the same number of rows). :mod:`benchmarks.latency_phases` runs one floor
phase per round, in the same run as the relay's phases.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks import compare_bench, output
from benchmarks.costs import percentile
from benchmarks.latency_report import TXN_ROWS, TXNS_PER_S
from benchmarks.relay_bench import services
from cdc_outbox.cdc.replication_stream import ReplicationStream
from cdc_outbox.config.settings import Settings
from cdc_outbox.pgwire import pgoutput
from cdc_outbox.pgwire.walproto import (
    XLOG_HEADER_SIZE,
    XLogData,
    parse_copy_data,
    pg_clock_to_unix,
)

_XLOGDATA, _BEGIN, _COMMIT = 0x77, 0x42, 0x43
LEGS = ("sent", "begin_received", "commit_received")
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


class CommitDrain(threading.Thread):
    """Receives the slot's frames and does nothing with them; appends to :attr:`times`, per
    transaction, (commit, sent, Begin received, Commit received), ``time.time()`` seconds."""

    def __init__(self, stream: ReplicationStream) -> None:
        super().__init__(name="floor-drain", daemon=True)
        self.stream = stream
        self.times: list[tuple[float, float, float, float]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._drain()
        except BaseException as exc:  # reported by floor_phase
            self.error = exc

    def _drain(self) -> None:
        sent = begin = 0.0
        last_status = time.monotonic()
        while not self.stop.is_set():
            data = self.stream.read_raw(0.1)
            if data is None or data[0] != _XLOGDATA:
                continue
            kind = data[XLOG_HEADER_SIZE]
            if kind == _BEGIN:
                begin = time.time()
                frame = parse_copy_data(data)
                assert isinstance(frame, XLogData)
                sent = pg_clock_to_unix(frame.server_clock)
            elif kind == _COMMIT:
                received = time.time()
                commit = pgoutput.decode(bytes(data[XLOG_HEADER_SIZE:]))
                assert isinstance(commit, pgoutput.Commit)
                self.times.append((pg_clock_to_unix(commit.commit_time), sent, begin, received))
                if time.monotonic() - last_status >= 1.0:
                    self.stream.send_status(commit.end_lsn, commit.end_lsn)
                    last_status = time.monotonic()


def drain_while(
    dsn: str, slot: str, publication: str, write: Callable[[], int], txn_size: int, timeout: float
) -> list[tuple[float, float, float, float]]:
    """Read ``slot`` with a :class:`CommitDrain` while ``write()`` commits transactions of
    ``txn_size`` rows (it returns how many events it wrote), until the drain has received all
    of them (at most ``timeout`` s after the writes); returns :attr:`CommitDrain.times`."""
    stream = ReplicationStream(dsn, slot, publication)
    stream.open(0)
    drain = CommitDrain(stream)
    drain.start()
    try:
        expected = write() // txn_size
        deadline = time.monotonic() + timeout
        while len(drain.times) < expected and drain.error is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the drain received {len(drain.times)} of {expected} commits")
            time.sleep(0.01)
    finally:
        drain.stop.set()
        drain.join(5)
        stream.close()
    if drain.error is not None:
        raise drain.error
    return drain.times


def floor_phase(settings: Settings, rate: float, seconds: float, warmup_s: float) -> dict[str, Any]:
    """Writers offer ``rate`` events/s in transactions of ``TXN_ROWS`` for ``warmup_s`` (not
    measured), then for ``seconds``, into a fresh table and slot read by a raw drain."""
    compare_bench._fresh(settings)
    dsn, columns = settings.postgres_dsn(), settings.column_names()
    spec = compare_bench._spec(rate, seconds, (TXN_ROWS,))

    def write() -> int:
        written = 0
        if warmup_s > 0:
            warmup = compare_bench._spec(rate, warmup_s, (TXN_ROWS,))
            compare_bench._run_writers(dsn, warmup, columns, None)
            written += warmup.events
        compare_bench._run_writers(dsn, spec, columns, None)
        return written + spec.events

    times = drain_while(dsn, compare_bench.SLOT, settings.publication_name, write, TXN_ROWS, 60)
    measured = times[-(spec.events // TXN_ROWS) :]
    return {
        "transactions": len(measured),
        "legs_ms": {
            leg: {
                name: round(1000 * percentile([(t[i] - t[0], 1) for t in measured], q), 1)
                for name, q in QUANTILES.items()
            }
            | {"max": round(1000 * max(t[i] - t[0] for t in measured), 1)}
            for i, leg in enumerate(LEGS, 1)
        },
    }


def main(argv: list[str]) -> int:
    """``python -m benchmarks latency-floor`` (see the module docstring)."""
    parser = output.parser("latency-floor", (__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup-seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.warmup_seconds < 0:
        print(
            "latency-floor: --rounds must be >= 1, --seconds > 0, --warmup-seconds >= 0",
            file=sys.stderr,
        )
        return 2
    rounds = []
    with services(None, None) as (dsn, bootstrap, _cpu):
        for number in range(args.rounds):
            settings = compare_bench._settings(dsn, bootstrap, "cdc", f"floor.{number}")
            phase = floor_phase(settings, TXNS_PER_S * TXN_ROWS, args.seconds, args.warmup_seconds)
            rounds.append(phase)
            print(f"round {number + 1}: {phase['transactions']} transactions")
            for leg, q in phase["legs_ms"].items():
                print(f"  {leg:<16} " + " ".join(f"{k} {v:>6}" for k, v in q.items()))
    output.save("latency-floor", {"seconds": args.seconds, "rounds": rounds}, args)
    return 0
