"""The end-to-end demo: local PostgreSQL + Kafka, init, relay, concurrent writers, verdict.

It proves the pipeline on this machine: every committed order event reaches Kafka at least
once, with key, value and headers as stored, in per-aggregate commit order. With
``value_format="avro"`` a local schema registry runs too, values are Avro (schema
``cdc_outbox_dev/schemas/OrderPlaced.avsc``) and the tally decodes each one with
confluent_kafka's AvroDeserializer, an independent reader, and compares it with the payload.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from cdc_outbox.admin import lifecycle
from cdc_outbox.config.settings import Settings
from cdc_outbox.lsn import Lsn
from cdc_outbox.service.relay_service import Service
from cdc_outbox.service.wiring import build_service
from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import read_topics
from cdc_outbox_dev.sandbox.kafka import LocalKafka
from cdc_outbox_dev.sandbox.postgres import LocalPostgres
from cdc_outbox_dev.sandbox.registry import LocalRegistry, registry_client

logger = logging.getLogger(__name__)
TOPIC_PREFIX = "demo.outbox"
SCHEMAS_DIR = Path(__file__).resolve().parent / "schemas"


def avro_reader(registry_url: str) -> Callable[[bytes | None], Any]:
    """Decode a Confluent wire-format value with AvroDeserializer (schema fetched by id)."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    deserializer = AvroDeserializer(registry_client(registry_url))
    ctx = SerializationContext(TOPIC_PREFIX, MessageField.VALUE)
    return lambda value: deserializer(value, ctx)


def run_demo(
    *,
    events: int,
    writers: int,
    aggregates: int,
    console: Console | None = None,
    value_format: str = "json",
) -> bool:
    """Run the whole demo; True when the tally is clean."""
    console = console or Console()
    # A brand-new broker answers "coordinator load in progress" for a moment: not news here.
    logging.getLogger("cdc_outbox.librdkafka").setLevel(logging.ERROR)
    avro = value_format == "avro"
    with console.status("starting local PostgreSQL and Kafka..."):
        pg = LocalPostgres()
        kafka = LocalKafka()
        registry = LocalRegistry() if avro else None
        pg.start()
        kafka.start()
        if registry is not None:
            registry.start()
    try:
        console.print(f"PostgreSQL: {pg.dsn}\nKafka: {kafka.bootstrap_servers}")
        values: dict[str, Any] = {
            "dsn": pg.dsn,
            "topic_template": TOPIC_PREFIX + ".{aggregate_type}",
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
            "status_interval_s": 2.0,
            "mode": "cdc",
            "metrics_port": 0,
        }
        if registry is not None:
            console.print(f"schema registry: {registry.url}")
            values["value_format"] = "avro"
            values["schema_registry"] = {
                "url": registry.url,
                "schemas_dir": str(SCHEMAS_DIR),
                "auto_register": True,
            }
        settings = Settings.model_validate(values)
        report = lifecycle.init(settings, create_table=True)
        for action in report.actions:
            console.print(f"init: {action.name}: {action.sql}")
        return _relay_and_verify(settings, events, writers, aggregates, console)
    finally:
        with console.status("stopping local services..."):
            if registry is not None:
                with contextlib.suppress(Exception):
                    registry.close()
            kafka.close()
            pg.close()


def _relay_and_verify(
    settings: Settings, events: int, writers: int, aggregates: int, console: Console
) -> bool:
    relay = build_service(settings)  # what `cdc-outbox run` runs
    failure: list[BaseException] = []

    def run_relay() -> None:
        try:
            relay.run()
        except BaseException as exc:
            failure.append(exc)

    relay_thread = threading.Thread(target=run_relay, name="relay", daemon=True)
    relay_thread.start()
    spec = workload.WorkloadSpec(
        events=events, writers=writers, aggregates=aggregates, rollback_every=25
    )
    written: list[workload.WriteReport] = []
    writer_thread = threading.Thread(
        target=lambda: written.append(
            workload.write_orders(settings.postgres_dsn(), spec, columns=settings.column_names())
        ),
        name="writers",
    )
    t0 = time.monotonic()
    writer_thread.start()
    with Live(_progress(relay, events, 0.0), console=console, refresh_per_second=4) as live:
        while (writer_thread.is_alive() or relay.stats.events_published < events) and (
            relay_thread.is_alive()
        ):
            live.update(_progress(relay, events, time.monotonic() - t0))
            time.sleep(0.25)
        live.update(_progress(relay, events, time.monotonic() - t0))
    writer_thread.join()
    relay.request_stop()
    relay_thread.join(60)
    if failure:
        console.print(f"[red]relay failed: {failure[0]}[/red]")
        return False
    expected = workload.stored_events(settings.postgres_dsn(), columns=settings.column_names())
    records = read_topics(settings.kafka.bootstrap_servers, TOPIC_PREFIX)
    rolled_back = written[0].rolled_back_ids if written else []
    decode = None
    if settings.value_format == "avro":
        decode = avro_reader(settings.schema_registry.url)
    verdict = workload.tally(expected, records, forbidden_ids=rolled_back, decode_value=decode)
    console.print()
    console.print(_verdict_table(verdict, len(rolled_back), relay))
    return verdict.ok and verdict.expected == events


def _progress(relay: Service, events: int, elapsed: float) -> Table:
    stats = relay.stats
    table = Table(title="cdc-outbox demo", show_header=False)
    table.add_row("events acknowledged by Kafka", f"{stats.events_published:,} / {events:,}")
    table.add_row("transactions relayed", f"{stats.transactions:,}")
    table.add_row("in flight", f"{stats.in_flight:,}")
    table.add_row("confirmed LSN", str(Lsn(stats.confirmed_lsn)))
    rate = stats.events_published / elapsed if elapsed > 0 else 0.0
    table.add_row("elapsed / rate", f"{elapsed:.1f}s / {rate:,.0f} events/s")
    return table


def _verdict_table(verdict: workload.Tally, rolled_back: int, relay: Service) -> Table:
    ok = "[green]OK[/green]" if verdict.ok else "[red]FAILED[/red]"
    table = Table(title=f"tally: {ok}", show_header=False)
    table.add_row("committed events (outbox rows)", f"{verdict.expected:,}")
    table.add_row("records read back from Kafka", f"{verdict.received:,}")
    table.add_row("missing", str(len(verdict.missing)))
    table.add_row("duplicates", str(verdict.duplicates))
    table.add_row("key/value mismatches", str(len(verdict.mismatched)))
    table.add_row("per-aggregate order violations", str(len(verdict.order_violations)))
    table.add_row(f"rolled-back events ({rolled_back}) published", str(len(verdict.unexpected)))
    table.add_row("dead-lettered", str(relay.stats.events_dead_lettered))
    table.add_row("slot confirmed at stop", str(Lsn(relay.stats.confirmed_lsn)))
    return table
