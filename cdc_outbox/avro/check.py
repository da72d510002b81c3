"""``cdc-outbox schemas check``: the configured schemas against the registry, before a run.

:func:`check_schemas` takes every record schema of ``schema_registry.schemas_dir``, works out
its value subject (``subject_name_strategy``; the topic strategies need the topic: ``topics``
maps a record name to it, else it comes from the outboxes' ``topic_template``s, none with
``{aggregate_type}``: each distinct topic they give is checked), asks the registry whether
the schema may follow the subject's latest version under the subject's compatibility rule
(BACKWARD by default) and, with ``auto_register``, registers it. Returns one
:class:`SchemaCheck` per schema and subject; a refused one
has ``problem`` naming the subject and the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cdc_outbox.avro.registry import RegistryClient, RegistryError
from cdc_outbox.avro.serializer import LocalSchema, load_schemas_dir
from cdc_outbox.avro.wire import subject_name
from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import ConfigError

__all__ = ["SchemaCheck", "check_schemas"]


@dataclass(frozen=True, slots=True)
class SchemaCheck:
    record: str
    subject: str
    path: str
    schema_id: int | None  # set when registered (auto_register)
    problem: str | None


def _topics(settings: Settings, record: str, topics: Mapping[str, str]) -> list[str]:
    """The topics ``record`` goes to: ``topics``' entry, else each outbox's template's."""
    for name in (record, record.rpartition(".")[2]):
        if name in topics:
            return [topics[name]]
    found: list[str] = []
    for outbox in settings.outbox_settings():
        template = outbox.topic_template
        if "{aggregate_type}" in template:
            raise ConfigError(
                f"config: subject_name_strategy {settings.schema_registry.subject_name_strategy!r}"
                f" needs the topic of {record}: give --topic {record.rpartition('.')[2]}=TOPIC"
            )
        topic = template.format(event_type=record.rpartition(".")[2])
        if topic not in found:
            found.append(topic)
    return found


def check_schemas(settings: Settings, topics: Mapping[str, str] | None = None) -> list[SchemaCheck]:
    """Check (and with ``auto_register`` register) every local schema; see the module doc.
    Raises ``RegistryUnavailable`` when the registry cannot be asked."""
    sr = settings.schema_registry
    if not sr.url or not sr.schemas_dir:
        raise ConfigError("config: schemas check needs schema_registry.url and .schemas_dir")
    client = RegistryClient(sr.url, sr.basic_auth_user_info.get_secret_value(), sr.timeout_s)
    local = {s.name: s for s in load_schemas_dir(sr.schemas_dir).values()}
    out: list[SchemaCheck] = []
    for name, schema in sorted(local.items()):
        record_topics = (
            [""] if sr.subject_name_strategy == "record" else _topics(settings, name, topics or {})
        )
        for topic in record_topics:
            out.append(_check_one(client, sr.auto_register, sr.subject_name_strategy, topic,
                                  name, schema))  # fmt: skip
    return out


def _check_one(
    client: RegistryClient, register: bool, strategy: str, topic: str, name: str,
    schema: LocalSchema,
) -> SchemaCheck:  # fmt: skip
    """Check (``register``: and register) ``schema`` under its subject for ``topic``."""
    subject = subject_name(strategy, topic, name)
    ok, messages = client.test_compatibility(subject, schema.text)
    problem = schema_id = None
    if not ok:
        rule = client.compatibility(subject)
        # Apicurio 2.x enforces its global rule but reports NONE: do not name a wrong one.
        rule_text = f"the {rule}" if rule != "NONE" else "the registry's"
        detail = "; ".join(messages)[:300] or "not compatible with the latest version"
        problem = (
            f"subject {subject!r}: {schema.path.name} breaks {rule_text} compatibility"
            f" rule ({detail})"
        )
    elif register:
        try:
            schema_id = client.register(subject, schema.text)
        except RegistryError as exc:
            problem = f"subject {subject!r}: {schema.path.name} refused: {exc.message[:300]}"
    return SchemaCheck(name, subject, str(schema.path), schema_id, problem)
