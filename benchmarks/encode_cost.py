"""Instructions per Avro encode of the relay benchmark's event, counted by callgrind.

    python -m benchmarks encode-cost [--events N] [--json PATH] [--write-results]

Wall-clock timings of a 3 µs call scatter by a third on a shared 2-core machine; callgrind's
instruction counts do not (the same total for the same build, inputs and environment). Each
measured call runs in a child ``python`` under ``valgrind --tool=callgrind`` twice, over N and
6N distinct OrderPlaced payloads (as PostgreSQL outputs the workload's jsonb), and again with
the encoding left out; per call = the difference of the differences / 5N. Measured:
``serializer`` (``AvroSerializer.encode``, the relay's call, its writer cached as after the
first event) and ``encode`` (``JsonToAvro.encode``, parse + checks + fastavro's writer).
Needs valgrind (Debian's package); exit 2 without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import callgrind

SCHEMA = Path(__file__).resolve().parent.parent / "cdc_outbox_dev" / "schemas" / "OrderPlaced.avsc"
_NAME = "encode-cost"
_WHAT = ("serializer", "encode")


def _records(n: int) -> list[Any]:
    from cdc_outbox.records import OutboxRecord

    out = []
    for i in range(n):
        payload = b'{"seq": %d, "note": "%s", "order": "order-%05d", "amount_cents": %d}' % (
            i,
            b"x" * 120,
            i % 1000,
            i * 7,
        )
        headers = [("id", b"%d" % i), ("event_type", b"OrderPlaced"), ("aggregate_type", b"order")]
        out.append(OutboxRecord("bench.order", b"order-%05d" % i, payload, headers, str(i)))
    return out


def _child(what: str, n: int) -> None:
    """Build ``n`` records, then encode each with ``what`` ("none": build only)."""
    from cdc_outbox.avro.serializer import AvroSerializer, _Writer
    from cdc_outbox.avro.wire import JsonToAvro, header, parse
    from cdc_outbox.config.delivery import avro_section
    from cdc_outbox.config.settings import Settings

    schema = parse(SCHEMA.read_text())
    records = _records(n)
    settings = Settings.model_validate(
        {"dsn": "host=none", "value_format": "avro", "schema_registry": {"url": "http://none"}}
    )
    serializer = AvroSerializer(avro_section(settings))
    serializer._writers[("bench.order", b"OrderPlaced")] = _Writer(1, schema, "s", False, 0.0)
    encoder = JsonToAvro(schema, header(1))
    if what == "serializer":
        for record in records:
            serializer.encode(record)
    elif what == "encode":
        for record in records:
            encoder.encode(record.value)


def measure(n: int) -> dict[str, Any]:
    """Instructions per call of each measured function (see the module docstring)."""
    base = callgrind.marginal(_NAME, "none", n)
    result: dict[str, Any] = {"events": n, "schema": SCHEMA.name}
    for what in _WHAT:
        spent = callgrind.marginal(_NAME, what, n)
        result[f"{what}_instructions"] = round((spent - base) / (5 * n))
    return result


def main(argv: list[str]) -> int:
    """``python -m benchmarks encode-cost`` (see the module docstring)."""
    return callgrind.main(
        argv,
        name=_NAME,
        description=(__doc__ or "").split("\n", 1)[0],
        children=_WHAT,
        child=_child,
        measure=measure,
        report=lambda result: "\n".join(
            f"{what:<12} {result[f'{what}_instructions']:>8,} instructions per call"
            for what in _WHAT
        ),
    )
