"""Structured logs (cdc_outbox.cli.common.setup_logging): JSON lines with context, redacted."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from cdc_outbox.cli import common

SECRET = 's3cr"t\\pw'  # quotes and backslashes: JSON escaping must not hide it from scrubbing


@pytest.fixture
def log_setup() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    common._SECRETS.add(SECRET)
    yield logging.getLogger("cdc_outbox.test")
    common._SECRETS.discard(SECRET)
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def test_json_lines_carry_context_fields_and_no_secrets(
    log_setup: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    common.setup_logging("INFO", "json")
    log_setup.warning(
        "event dead-lettered: password=%s",
        SECRET,
        extra={"event_id": "e-1", "aggregate_id": "order-7", "event_type": "OrderPlaced",
               "lsn": "0/16B3748", "mode": "cdc", "unrelated": "x"},
    )  # fmt: skip
    try:
        raise RuntimeError(f"connect failed with {SECRET}")
    except RuntimeError:
        log_setup.exception("relay restarting", extra={"mode": "cdc"})
    lines = capsys.readouterr().err.strip().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert first["level"] == "WARNING" and first["logger"] == "cdc_outbox.test"
    assert first["event_id"] == "e-1" and first["aggregate_id"] == "order-7"
    assert first["event_type"] == "OrderPlaced" and first["lsn"] == "0/16B3748"
    assert first["mode"] == "cdc"
    assert "unrelated" not in first
    assert first["message"] == "event dead-lettered: password=***"
    assert first["ts"].endswith("+00:00")
    assert second["mode"] == "cdc" and "event_id" not in second
    assert "RuntimeError: connect failed with ***" in second["exc"]
    assert SECRET not in "\n".join(lines)
    assert json.dumps(SECRET)[1:-1] not in "\n".join(lines)  # nor its escaped form


def test_text_lines_append_context(
    log_setup: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    common.setup_logging("INFO", "text")
    log_setup.info("published", extra={"event_id": "e-2", "lsn": "0/10"})
    log_setup.info("plain %s", SECRET)
    first, second = capsys.readouterr().err.strip().splitlines()
    assert first.endswith("cdc_outbox.test: published [event_id=e-2 lsn=0/10]")
    assert second.endswith("plain ***")
