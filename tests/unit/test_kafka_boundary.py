"""Only the cdc_outbox.kafka package talks to Kafka: no other shipped module imports
confluent_kafka (the dev harness, cdc_outbox_dev, may: it reads topics back). One exception:
the schema-registry adapter (avro/registry.py) imports ``confluent_kafka.schema_registry``,
the library's registry client (HTTP to the registry, not Kafka), and nothing else of it."""

from __future__ import annotations

import ast
from pathlib import Path

from cdc_outbox.delivery.policy import guarantee_in_effect

PACKAGE = Path(__file__).resolve().parents[2] / "cdc_outbox"


def _confluent_imports(path: Path) -> list[str]:
    """The ``confluent_kafka`` modules ``path`` imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        found += [n for n in names if n.split(".")[0] == "confluent_kafka"]
    return found


def test_only_the_kafka_package_imports_confluent_kafka() -> None:
    importers = {
        p.relative_to(PACKAGE).as_posix(): _confluent_imports(p) for p in PACKAGE.rglob("*.py")
    }
    importers = {path: mods for path, mods in importers.items() if mods}
    assert "kafka/publisher.py" in importers  # the check sees real imports
    registry = importers.pop("avro/registry.py", [])
    assert all(m.startswith("confluent_kafka.schema_registry") for m in registry), registry
    assert [p for p in importers if not p.startswith("kafka/")] == []


def test_polling_is_at_least_once_whatever_is_configured() -> None:
    assert guarantee_in_effect("exactly_once", "STREAMING") == "exactly_once"
    assert guarantee_in_effect("exactly_once", "CATCHING_UP") == "exactly_once"
    assert guarantee_in_effect("exactly_once", "POLLING") == "at_least_once"
    assert guarantee_in_effect("at_least_once", "STREAMING") == "at_least_once"
