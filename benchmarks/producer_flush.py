"""The Kafka half of a transaction's commit->ack at issue 25's load, alone: a producer with the
relay's defaults sends ``TXN_ROWS`` records over 3 partitions, ``TXNS_PER_S`` times a second,
and times each flush (its last delivery report). Rounds alternate a librdkafka setting between
two values, on one local broker and nothing else: an A/B of that setting, a diagnostic, not a
target.

    python -m benchmarks producer-flush [--setting socket.nagle.disable] [--values false,true]
        [--rounds 4] [--batches 400] [--json PATH] [--write-results]
"""

from __future__ import annotations

import sys
import time
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from benchmarks import output
from benchmarks.costs import percentile
from benchmarks.latency_report import TXN_ROWS, TXNS_PER_S
from cdc_outbox.kafka.producer_config import producer_config
from cdc_outbox_dev.sandbox.kafka import LocalKafka

_TOPIC, _PARTITIONS, _WARM = "flush-ab", 3, 20


def flush_times(config: dict[str, Any], batches: int) -> list[float]:
    """Milliseconds of each flush after ``_WARM`` unmeasured ones, at ``TXNS_PER_S``."""
    producer = Producer(config)
    times: list[float] = []
    due = time.monotonic()
    for n in range(batches + _WARM):
        due += 1 / TXNS_PER_S
        time.sleep(max(0.0, due - time.monotonic()))
        for row in range(TXN_ROWS):
            producer.produce(_TOPIC, b"v" * 200, key=str(row).encode())
        t0 = time.perf_counter()
        if producer.flush(30):
            raise RuntimeError("records left after a 30 s flush")
        if n >= _WARM:
            times.append((time.perf_counter() - t0) * 1000)
    return times


def main(argv: list[str]) -> int:
    """``python -m benchmarks producer-flush`` (see the module docstring)."""
    parser = output.parser("producer-flush", (__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--setting", default="socket.nagle.disable")
    parser.add_argument("--values", default="false,true", help="two values, comma-separated")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batches", type=int, default=400)
    args = parser.parse_args(argv)
    values = args.values.split(",")
    if len(values) != 2 or args.rounds < 1 or args.batches < 1:
        print("producer-flush: --values takes 2 values; --rounds, --batches >= 1", file=sys.stderr)
        return 2
    rounds: list[dict[str, Any]] = []
    with LocalKafka() as kafka:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
        admin.create_topics([NewTopic(_TOPIC, _PARTITIONS, 1)])[_TOPIC].result(30)
        for number in range(args.rounds):
            for value in values:
                config, _ = producer_config(
                    {"bootstrap.servers": kafka.bootstrap_servers, args.setting: value}
                )
                ms = [(t, 1) for t in flush_times(config, args.batches)]
                q = {k: round(percentile(ms, p), 2) for k, p in (("p50", 0.5), ("p99", 0.99))}
                rounds.append({"round": number + 1, args.setting: value, "flush_ms": q})
                print(f"round {number + 1} {args.setting}={value}: {q}", flush=True)
    output.save("producer-flush", {"batches": args.batches, "rounds": rounds}, args)
    return 0
