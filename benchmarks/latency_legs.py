"""Where commit->ack latency goes at 20 transactions/s x 100 rows (issue 25's latency load),
at-least-once: a diagnostic, not a target.

    python -m benchmarks latency-legs [--rounds N] [--mark update|delete|off] [--json PATH]
        [--write-results]

Runs :func:`benchmarks.compare_bench.latency_phase` on local services with the relay's own
classes wrapped (in this process only) to time every transaction's legs, from its commit
timestamp (PostgreSQL's clock; the same host):

- ``sent``: the walsender stamped the transaction's Begin (the XLogData send time);
- ``begin_read`` / ``commit_read``: the relay handled its Begin / Commit message;
- ``first_ack`` / ``acked``: the first / last of its records' delivery reports;
- ``read_leg``: Begin to Commit handled; ``ack_leg``: Commit handled to the last report.

Quantiles p50, p90, p99 and max over the measured transactions, in milliseconds.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from benchmarks import compare_bench, output
from benchmarks.latency_report import TXN_ROWS, TXNS_PER_S
from benchmarks.relay_bench import services
from cdc_outbox.cdc import message_router, replication_stream, txn_handle
from cdc_outbox.pgwire.walproto import (
    XLOG_HEADER_SIZE,
    XLogData,
    parse_copy_data,
    pg_clock_to_unix,
)

#: Per measured transaction: commit, sent, begin read, commit read, first ack, last ack (unix s).
_TIMES: list[tuple[float, float, float, float, float, float]] = []
_LAST_SENT = [0.0]


def _instrument() -> None:
    """Wrap the stream's read and the transaction handle (this process only)."""
    read_raw = replication_stream.ReplicationStream.read_raw

    def timed_read(self: replication_stream.ReplicationStream, timeout: float) -> Any:
        data = read_raw(self, timeout)
        # A Begin (in an XLogData frame): its send time, for the TxnHandle made next.
        if data is not None and data[0] == 0x77 and data[XLOG_HEADER_SIZE] == 0x42:
            frame = parse_copy_data(data)
            assert isinstance(frame, XLogData)
            _LAST_SENT[0] = pg_clock_to_unix(frame.server_clock)
        return data

    class TimedTxn(txn_handle.TxnHandle):
        __slots__ = ("_commit", "t_begin", "t_commit", "t_first", "t_sent")

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._commit = 0.0
            super().__init__(*args, **kwargs)
            self.t_begin, self.t_sent = time.time(), _LAST_SENT[0]
            self.t_commit = self.t_first = 0.0

        @property
        def commit_unix(self) -> float:
            return self._commit

        @commit_unix.setter
        def commit_unix(self, value: float) -> None:
            self._commit = value
            if value:
                self.t_commit = time.time()

        def published(self, topic: str) -> None:
            self.t_first = self.t_first or time.time()
            super().published(topic)
            if self.pending == 0 and self._commit:
                _TIMES.append(
                    (
                        self._commit,
                        self.t_sent,
                        self.t_begin,
                        self.t_commit,
                        self.t_first,
                        time.time(),
                    )
                )

    replication_stream.ReplicationStream.read_raw = timed_read  # type: ignore[method-assign]
    message_router.TxnHandle = TimedTxn  # type: ignore[attr-defined]  # one per transaction


def _quantiles(values: list[float]) -> list[float]:
    ordered = sorted(values)
    return [round(1000 * ordered[int(q * (len(ordered) - 1))], 1) for q in (0.5, 0.9, 0.99, 1.0)]


def legs(times: list[tuple[float, float, float, float, float, float]]) -> dict[str, list[float]]:
    """p50, p90, p99, max (ms) of every leg over ``times``."""
    parts = {
        "sent": 1,
        "begin_read": 2,
        "commit_read": 3,
        "first_ack": 4,
        "acked": 5,
    }
    out = {name: _quantiles([t[i] - t[0] for t in times]) for name, i in parts.items()}
    out["read_leg"] = _quantiles([t[3] - t[2] for t in times])
    out["ack_leg"] = _quantiles([t[5] - t[3] for t in times])
    return out


def main(argv: list[str]) -> int:
    """``python -m benchmarks latency-legs`` (see the module docstring)."""
    parser = output.parser("latency-legs", (__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--mark", choices=["update", "delete", "off"], default="update")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0:
        print("latency-legs: --rounds must be >= 1 and --seconds > 0", file=sys.stderr)
        return 2
    _instrument()
    rounds: list[dict[str, Any]] = []
    with services(None, None) as (dsn, bootstrap, cpu):
        stamp = int(time.time())
        for number in range(args.rounds):
            prefix = f"legs.{stamp}.{number}"
            settings = compare_bench._settings(dsn, bootstrap, "cdc", prefix)
            settings = settings.model_copy(update={"cdc_mark_published": args.mark})
            compare_bench._create_topic(settings, f"{prefix}.order")
            _TIMES.clear()
            phase = compare_bench.latency_phase(
                settings, TXNS_PER_S * TXN_ROWS, args.seconds, cpu, 5.0, txn_sizes=(TXN_ROWS,)
            )
            measured = _TIMES[-phase["latency_events"] // TXN_ROWS :]
            result = {"latency_ms": phase["latency_ms"], "legs_ms": legs(measured)}
            rounds.append(result)
            print(f"round {number + 1}: {result['latency_ms']}")
            for name, q in result["legs_ms"].items():
                print(f"  {name:<12} p50 {q[0]:>6} p90 {q[1]:>6} p99 {q[2]:>6} max {q[3]:>6}")
    output.save(
        "latency-legs", {"mark": args.mark, "seconds": args.seconds, "rounds": rounds}, args
    )
    return 0
