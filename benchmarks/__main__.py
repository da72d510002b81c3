"""Entry point: ``python -m benchmarks relay --events N --txn-size K --json PATH``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from benchmarks import relay_bench


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
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka producer setting for the relay (repeatable)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "relay":
        if args.events <= 0 or args.txn_size <= 0:
            parser.error("--events and --txn-size must be positive")
        result = relay_bench.run(args)
        relay_bench.print_table(result)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
