"""``python -m benchmarks relay|compare|consume``: the benchmarks that bring up their own
local PostgreSQL and Kafka (or use ``--dsn``/``--bootstrap-servers``) and compare two ways of
doing the same work in one run. Each prints a table and writes JSON (:mod:`benchmarks.output`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks import output

RELAY = "Relay vs raw slot drain into Kafka over the same WAL (median ratio of rounds)."
COMPARE = (
    "CDC vs polling: throughput, commit->ack latency, database cost; exactly-once vs"
    " at-least-once; the cost of cdc_mark_published."
)
CONSUME = "Idempotent consumer (no-op handler) vs a bare poll loop: events/s, dedupe on/off."


def relay(argv: list[str]) -> int:
    """``python -m benchmarks relay``."""
    parser = output.parser("relay", RELAY)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--txn-size", type=int, default=100)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument(
        "--outboxes",
        type=int,
        default=1,
        help="outbox tables ([[outboxes]], one slot, each its own topics): the same events"
        " spread evenly over them (default 1: the single-table keys)",
    )
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: start a local server)")
    parser.add_argument("--bootstrap-servers", help="Kafka (default: start a local broker)")
    parser.add_argument("--profile", type=Path, help="write a cProfile of the relay phase here")
    parser.add_argument(
        "--cdc-mark-published",
        choices=["update", "delete", "off"],
        default="update",
        help="CDC housekeeping of acknowledged rows (the relay's setting; default update)",
    )
    parser.add_argument(
        "--value-format",
        choices=["json", "avro"],
        default="json",
        help="avro: also relay the same WAL with Avro values (local registry) and compare",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=6,
        help="rounds of (raw drain, relay) over the same WAL; the median ratio is reported (even:"
        " as many with the raw drain first as second)",
    )
    parser.add_argument(
        "--avro-rounds",
        type=int,
        default=12,
        help="with --value-format avro: Avro/JSON pairs over the same WAL (median ratio; even:"
        " as many with Avro first as second)",
    )
    parser.add_argument(
        "--delivery",
        choices=["at_least_once", "exactly_once"],
        default="at_least_once",
        help="the relay's delivery guarantee (exactly_once: until Kafka committed every event)",
    )
    parser.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka producer setting for the relay (repeatable)",
    )
    args = parser.parse_args(argv)
    if min(args.events, args.txn_size, args.rounds, args.avro_rounds, args.outboxes) <= 0:
        parser.error(
            "--events, --txn-size, --rounds, --avro-rounds and --outboxes must be positive"
        )
    if args.outboxes > 1 and args.value_format == "avro":
        parser.error("--outboxes > 1 relays JSON values only")
    from benchmarks import relay_bench, relay_report

    try:
        result = relay_bench.run(args)
    except relay_bench.SlotsExhausted as exc:
        print(exc, file=sys.stderr)
        return 2
    relay_report.print_table(result)
    output.save("relay", result, args)
    return 0


def compare(argv: list[str]) -> int:
    """``python -m benchmarks compare`` (``--only`` one part)."""
    parser = output.parser("compare", COMPARE)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=2_000.0, help="latency phase events/s")
    parser.add_argument("--latency-seconds", type=float, default=30.0)
    parser.add_argument(
        "--latency-warmup-seconds",
        type=float,
        default=10.0,
        help="unmeasured load at --rate before each latency phase",
    )
    parser.add_argument(
        "--eos-events",
        type=int,
        default=100_000,
        help="events per exactly-once vs at-least-once run",
    )
    parser.add_argument("--eos-rounds", type=int, default=3, help="rounds of that pair (median)")
    parser.add_argument(
        "--mark-events", type=int, default=50_000, help="events per cdc_mark_published phase"
    )
    parser.add_argument("--mark-rounds", type=int, default=1, help="rounds of those (median)")
    parser.add_argument(
        "--latency-rounds",
        type=int,
        default=2,
        help="rounds of the exactly-once vs at-least-once latency pair at 20 txns/s x 100 rows",
    )
    parser.add_argument(
        "--only",
        choices=["mark-cost", "eos-latency", "eos", "eos-throughput"],
        help="run only this part: mark-cost (the cdc_mark_published costs), eos-latency (the"
        " latency pair), eos (the pair and the throughput rounds) or eos-throughput (the"
        " throughput rounds); --json only (no --write-results or --results)",
    )
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: start a local server)")
    parser.add_argument("--bootstrap-servers", help="Kafka (default: start a local broker)")
    parser.add_argument(
        "--results",
        type=Path,
        help="also write the Markdown report here (the tables of docs/performance.md)",
    )
    args = parser.parse_args(argv)
    sizes = (args.events, args.rate, args.latency_seconds, args.eos_events, args.eos_rounds)
    if min(*sizes, args.mark_events, args.mark_rounds, args.latency_rounds) <= 0:
        parser.error(
            "--events, --rate, --latency-seconds, --eos-events, --eos-rounds, --mark-events,"
            " --mark-rounds and --latency-rounds must be positive"
        )
    if args.latency_warmup_seconds < 0:
        parser.error("--latency-warmup-seconds must not be negative")
    if args.only and (args.write_results or args.results):
        parser.error("--only runs one part: its JSON goes to --json only")
    from benchmarks import compare_bench, compare_report, latency_phases, latency_report, mark_cost

    if args.only == "mark-cost":
        result = compare_bench.run(args)
        mark_cost.print_table(result["mark_cost"])
    elif args.only == "eos-throughput":
        result = compare_bench.run(args)
        compare_report.print_eos_rounds(result)
    elif args.only:
        result = latency_phases.run_only(args)
        latency_report.print_section(result["eos_latency"])
    else:
        result = compare_bench.run(args, extras=(latency_phases.add_to,))
        compare_report.print_table(result)
    output.save("compare", result, args)
    if args.results:
        compare_report.write_results(result, args.results, _command("compare", argv))
        print(f"wrote {args.results}")
    return 0


def consume(argv: list[str]) -> int:
    """``python -m benchmarks consume``."""
    parser = output.parser("consume", CONSUME)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument(
        "--poll-batch", type=int, help="records per poll (default: the consumer's poll_batch)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of bare, de-dup, no de-dup (median)"
    )
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: start a local server)")
    parser.add_argument("--bootstrap-servers", help="Kafka (default: start a local broker)")
    parser.add_argument(
        "--results",
        type=Path,
        help="also write the Markdown section here (as in docs/performance.md)",
    )
    args = parser.parse_args(argv)
    if min(args.events, args.rounds) <= 0:
        parser.error("--events and --rounds must be positive")
    from benchmarks import consume_bench

    result = consume_bench.run(args)
    consume_bench.print_table(result)
    output.save("consume", result, args)
    if args.results:
        consume_bench.write_section(result, args.results, _command("consume", argv))
        print(f"wrote {args.results}")
    return 0


def _command(name: str, argv: list[str]) -> str:
    return " ".join(["python -m benchmarks", name, *argv])
