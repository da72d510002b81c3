"""Only the cdc_outbox.kafka package talks to Kafka: no other shipped module imports
confluent_kafka (the dev harness, cdc_outbox_dev, may: it reads topics back)."""

from __future__ import annotations

import ast
from pathlib import Path

from cdc_outbox.delivery.policy import guarantee_in_effect

PACKAGE = Path(__file__).resolve().parents[2] / "cdc_outbox"


def _imports_confluent(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "confluent_kafka" for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("confluent_kafka"):
            return True
    return False


def test_only_the_kafka_package_imports_confluent_kafka() -> None:
    importers = sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if _imports_confluent(p)
    )
    assert "kafka/publisher.py" in importers  # the check sees real imports
    assert [p for p in importers if not p.startswith("kafka/")] == []


def test_polling_is_at_least_once_whatever_is_configured() -> None:
    assert guarantee_in_effect("exactly_once", "STREAMING") == "exactly_once"
    assert guarantee_in_effect("exactly_once", "CATCHING_UP") == "exactly_once"
    assert guarantee_in_effect("exactly_once", "POLLING") == "at_least_once"
    assert guarantee_in_effect("at_least_once", "STREAMING") == "at_least_once"
