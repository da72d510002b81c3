"""Entry point: ``python -m benchmarks relay --events N --txn-size K --json PATH`` and
``python -m benchmarks compare --events N --json PATH`` (CDC vs polling, writes RESULTS.md) and
``python -m benchmarks consume --events N --json PATH`` (the idempotent consumer)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import (
    compare_bench,
    compare_report,
    consume_bench,
    latency_phases,
    latency_report,
    mark_cost,
    relay_bench,
    relay_report,
)
from benchmarks.output import write_json


def _save(
    result: dict[str, Any],
    args: argparse.Namespace,
    argv: list[str] | None,
    write_results: Callable[[dict[str, Any], Path, str], None] | None = None,
) -> None:
    """Write ``result`` to ``--json`` and, with ``write_results``, its section to ``--results``."""
    write_json(args.json, result)
    if write_results is None:
        print(f"wrote {args.json}")
        return
    command = " ".join(["python -m benchmarks", *(argv if argv is not None else sys.argv[1:])])
    write_results(result, args.results, command)
    print(f"wrote {args.json} and {args.results}")


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    sub = parser.add_subparsers(dest="command", required=True)
    relay = sub.add_parser("relay", help="raw slot drain vs full relay into Kafka (same WAL)")
    relay.add_argument("--events", type=int, default=100_000)
    relay.add_argument("--txn-size", type=int, default=100)
    relay.add_argument("--writers", type=int, default=4)
    relay.add_argument("--dsn", help="PostgreSQL DSN (default: start a local server)")
    relay.add_argument("--bootstrap-servers", help="Kafka (default: start a local broker)")
    relay.add_argument("--json", type=Path, default=Path("benchmarks/out/relay.json"))
    relay.add_argument("--profile", type=Path, help="write a cProfile of the relay phase here")
    relay.add_argument(
        "--cdc-mark-published",
        choices=["update", "delete", "off"],
        default="update",
        help="CDC housekeeping of acknowledged rows (the relay's setting; default update)",
    )
    relay.add_argument(
        "--value-format",
        choices=["json", "avro"],
        default="json",
        help="avro: also relay the same WAL with Avro values (local registry) and compare",
    )
    relay.add_argument(
        "--rounds",
        type=int,
        default=6,
        help="rounds of (raw drain, relay) over the same WAL; the median ratio is reported (even:"
        " as many with the raw drain first as second)",
    )
    relay.add_argument(
        "--avro-rounds",
        type=int,
        default=12,
        help="with --value-format avro: Avro/JSON pairs over the same WAL (median ratio; even:"
        " as many with Avro first as second)",
    )
    relay.add_argument(
        "--delivery",
        choices=["at_least_once", "exactly_once"],
        default="at_least_once",
        help="the relay's delivery guarantee (exactly_once: until Kafka committed every event)",
    )
    relay.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka producer setting for the relay (repeatable)",
    )
    compare = sub.add_parser("compare", help="CDC vs polling: throughput, latency, DB cost")
    compare.add_argument("--events", type=int, default=20_000)
    compare.add_argument("--writers", type=int, default=4)
    compare.add_argument("--rate", type=float, default=2_000.0, help="latency phase events/s")
    compare.add_argument("--latency-seconds", type=float, default=30.0)
    compare.add_argument(
        "--latency-warmup-seconds",
        type=float,
        default=10.0,
        help="unmeasured load at --rate before each latency phase",
    )
    compare.add_argument(
        "--eos-events",
        type=int,
        default=100_000,
        help="events per exactly-once vs at-least-once run",
    )
    compare.add_argument("--eos-rounds", type=int, default=3, help="rounds of that pair (median)")
    compare.add_argument(
        "--mark-events", type=int, default=50_000, help="events per cdc_mark_published phase"
    )
    compare.add_argument("--mark-rounds", type=int, default=1, help="rounds of those (median)")
    compare.add_argument(
        "--latency-rounds",
        type=int,
        default=2,
        help="rounds of the exactly-once vs at-least-once latency pair at 20 txns/s x 100 rows",
    )
    compare.add_argument(
        "--only",
        choices=["mark-cost", "eos-latency", "eos"],
        help="run only this part: mark-cost (the cdc_mark_published costs), eos-latency (the"
        " latency pair) or eos (the pair and the throughput rounds); JSON only, RESULTS.md is"
        " left alone",
    )
    compare.add_argument("--dsn", help="PostgreSQL DSN (default: start a local server)")
    compare.add_argument("--bootstrap-servers", help="Kafka (default: start a local broker)")
    compare.add_argument("--json", type=Path, default=Path("benchmarks/out/compare.json"))
    compare.add_argument("--results", type=Path, default=Path("benchmarks/RESULTS.md"))
    consume = sub.add_parser("consume", help="idempotent consumer: events/s, dedupe on/off")
    consume.add_argument("--events", type=int, default=50_000)
    consume.add_argument(
        "--poll-batch", type=int, help="records per poll (default: the consumer's poll_batch)"
    )
    consume.add_argument(
        "--rounds", type=int, default=3, help="rounds of bare, de-dup, no de-dup (median)"
    )
    consume.add_argument("--dsn", help="PostgreSQL DSN (default: start a local server)")
    consume.add_argument("--bootstrap-servers", help="Kafka (default: start a local broker)")
    consume.add_argument("--json", type=Path, default=Path("benchmarks/results/consume.json"))
    consume.add_argument("--results", type=Path, default=Path("benchmarks/RESULTS.md"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # A SIGTERM (kill, timeout) ends a run as Ctrl-C does: the local servers it started (in
    # sessions of their own) are stopped on the way out instead of outliving it.
    signal.signal(signal.SIGTERM, _terminated)
    if args.command == "relay":
        if min(args.events, args.txn_size, args.rounds, args.avro_rounds) <= 0:
            parser.error("--events, --txn-size, --rounds and --avro-rounds must be positive")
        try:
            result = relay_bench.run(args)
        except relay_bench.SlotsExhausted as exc:
            print(exc, file=sys.stderr)
            return 2
        relay_report.print_table(result)
        _save(result, args, argv)
    elif args.command == "compare":
        sizes = (args.events, args.rate, args.latency_seconds, args.eos_events, args.eos_rounds)
        if min(*sizes, args.mark_events, args.mark_rounds, args.latency_rounds) <= 0:
            parser.error(
                "--events, --rate, --latency-seconds, --eos-events, --eos-rounds, --mark-events,"
                " --mark-rounds and --latency-rounds must be positive"
            )
        if args.latency_warmup_seconds < 0:
            parser.error("--latency-warmup-seconds must not be negative")
        if args.only == "mark-cost":
            result = compare_bench.run(args)
            mark_cost.print_table(result["mark_cost"])
            _save(result, args, argv)
            return 0
        if args.only:
            result = latency_phases.run_only(args)
            latency_report.print_section(result["eos_latency"])
            _save(result, args, argv)
            return 0
        result = compare_bench.run(args, extras=(latency_phases.add_to,))
        compare_report.print_table(result)
        _save(result, args, argv, compare_report.write_results)
    elif args.command == "consume":
        if min(args.events, args.rounds) <= 0:
            parser.error("--events and --rounds must be positive")
        result = consume_bench.run(args)
        consume_bench.print_table(result)
        _save(result, args, argv, consume_bench.write_section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
