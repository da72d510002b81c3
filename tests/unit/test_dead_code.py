"""Issue 35: dead code stays out. A counter of :class:`RelayStats` that nothing reads (no
metric, no command, no test) is work on the hot path for nobody; removed names stay gone."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from cdc_outbox import errors
from cdc_outbox.kafka import producer_config
from cdc_outbox.kafka.publisher import KafkaPublisher
from cdc_outbox.pgwire import walproto
from cdc_outbox.telemetry.relay_stats import RelayStats

PACKAGE = Path(errors.__file__).parent
TESTS = Path(__file__).parents[1]
#: Write-only counters allowed anyway: none.
KNOWN_UNREAD: set[str] = set()


def _sources() -> dict[Path, str]:
    files = [*PACKAGE.rglob("*.py"), *TESTS.rglob("*.py")]
    return {p: p.read_text() for p in files if p.name != "relay_stats.py"}


def test_every_relay_stats_field_is_read_somewhere() -> None:
    sources = _sources()
    unread = []
    for field in dataclasses.fields(RelayStats):
        name = re.escape(field.name)
        read = re.compile(rf"\.{name}\b(?!\s*[-+]?=[^=])|[\"']{name}[\"']")
        if not any(read.search(text) for text in sources.values()):
            unread.append(field.name)
    assert set(unread) <= KNOWN_UNREAD, f"RelayStats fields only ever written: {unread}"


def test_removed_names_stay_gone() -> None:
    assert not hasattr(KafkaPublisher, "ensure_connected")  # a copy of kafka/probe.py
    assert not hasattr(walproto, "STATUS_UPDATE_SIZE")
    assert not hasattr(producer_config, "redact_config")  # redaction.redact_kafka_config
