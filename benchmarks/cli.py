"""The one entry point: ``python -m benchmarks NAME [options]``.

:data:`BENCHMARKS` lists every benchmark: its name, what it measures and the function that
runs it (imported only when that benchmark runs, so ``--help`` starts no server and loads no
client library). ``python -m benchmarks`` or ``--help`` lists them; ``NAME --help`` shows a
benchmark's options; an unknown NAME is one line on stderr and exit 2. Every benchmark writes
``benchmarks/out/NAME.json`` (or ``--json PATH``) and, only with ``--write-results``, the tracked
``benchmarks/results/NAME.json``.
"""

from __future__ import annotations

import importlib
import logging
import signal
import sys
from collections.abc import Callable
from typing import NamedTuple, cast


class Benchmark(NamedTuple):
    """``target`` is ``module:function``, the function taking the arguments after NAME."""

    summary: str
    target: str

    def main(self) -> Callable[[list[str]], int]:
        module, function = self.target.split(":")
        return cast(Callable[[list[str]], int], getattr(importlib.import_module(module), function))


BENCHMARKS: dict[str, Benchmark] = {
    "relay": Benchmark(
        "relay vs raw slot drain into Kafka, same WAL (JSON or Avro values)",
        "benchmarks.commands:relay",
    ),
    "compare": Benchmark(
        "CDC vs polling; exactly-once vs at-least-once; cdc_mark_published costs",
        "benchmarks.commands:compare",
    ),
    "consume": Benchmark(
        "idempotent consumer vs a bare poll loop, de-duplication on/off",
        "benchmarks.commands:consume",
    ),
    "relay-cost": Benchmark(
        "instructions per event of the relay's hot path (callgrind, no servers)",
        "benchmarks.relay_cost:main",
    ),
    "encode-cost": Benchmark(
        "instructions per Avro encode of the benchmark's event (callgrind, no servers)",
        "benchmarks.encode_cost:main",
    ),
    "latency-legs": Benchmark(
        "commit->ack latency split into legs at 20 txns/s x 100 rows",
        "benchmarks.latency_legs:main",
    ),
    "latency-floor": Benchmark(
        "commit->Commit received by a raw slot drain, no relay (the latency floor)",
        "benchmarks.latency_floor:main",
    ),
    "producer-flush": Benchmark(
        "A/B of a librdkafka setting: flush time of 100-record batches",
        "benchmarks.producer_flush:main",
    ),
    "outboxes": Benchmark(
        "N outbox tables through one slot vs N relays with a slot each: CPU per event",
        "benchmarks.outboxes_bench:main",
    ),
    "debezium": Benchmark(
        "cdc-outbox vs Debezium (Kafka Connect, outbox EventRouter): drains, latency, CPU, RSS",
        "benchmarks.debezium_bench:main",
    ),
    "caught-up-cpu": Benchmark(
        "relay process CPU per event while caught up (default 2,000 single-row txns/s)",
        "benchmarks.caught_up_cpu:main",
    ),
    "table-less-cost": Benchmark(
        "WAL and writer time per event: outbox row vs logical message (PostgreSQL only)",
        "benchmarks.table_less_cost:main",
    ),
}

PROG = "python -m benchmarks"


def usage() -> str:
    """The top-level help: the command line and one line per benchmark."""
    width = max(map(len, BENCHMARKS))
    lines = [
        f"usage: {PROG} NAME [options]   ({PROG} NAME --help: the benchmark's options)",
        "",
        "benchmarks (JSON to benchmarks/out/NAME.json or --json PATH; --write-results also",
        "writes the tracked benchmarks/results/NAME.json):",
    ]
    lines += [f"  {name:<{width}}  {b.summary}" for name, b in BENCHMARKS.items()]
    return "\n".join(lines)


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark named by ``argv[0]`` with the rest of ``argv``."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    name, rest = args[0], args[1:]
    benchmark = BENCHMARKS.get(name)
    if benchmark is None:
        print(
            f"{PROG}: unknown benchmark {name!r} (one of: {', '.join(BENCHMARKS)})", file=sys.stderr
        )
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # A SIGTERM (kill, timeout) ends a run as Ctrl-C does: the local servers it started (in
    # sessions of their own) are stopped on the way out instead of outliving it.
    signal.signal(signal.SIGTERM, _terminated)
    return benchmark.main()(rest)
