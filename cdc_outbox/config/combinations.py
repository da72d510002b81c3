"""The settings validator's cross-field rules: combinations the relay cannot honour are
refused with one line (``ValueError``, exit 2 from ``load_settings``), in this order; the
mode rules are :func:`cdc_outbox.config.modes.resolve_mode`. Pure: no I/O."""

from __future__ import annotations

import importlib.util
from typing import Literal, Protocol

from cdc_outbox.config.cloudevents_rules import check_settings
from cdc_outbox.config.models import SchemaRegistrySettings
from cdc_outbox.config.modes import ModeInputs, resolve_mode

__all__ = ["Combination", "check_combination"]


class Combination(ModeInputs, Protocol):
    """What the rules read of the settings (``Settings`` fits)."""

    @property
    def value_format(self) -> str: ...

    @property
    def key_format(self) -> str: ...

    @property
    def schema_registry(self) -> SchemaRegistrySettings: ...

    @property
    def cloudevents(self) -> str: ...

    @property
    def null_payload(self) -> str: ...

    @property
    def tracing_relay_span(self) -> bool: ...

    @property
    def on_permanent_error(self) -> str: ...

    def _check_outboxes(self, explicit: set[str]) -> None: ...


def check_combination(s: Combination, explicit: set[str]) -> Literal["dead_letter", "halt"]:
    """Refuse what ``s`` cannot honour (``explicit``: the keys the user set). Returns what
    ``on_permanent_error`` resolves to: left unset beside a statusless table, halt."""
    if "avro" in (s.value_format, s.key_format) and not s.schema_registry.url:
        raise ValueError(
            'value_format/key_format = "avro" needs schema_registry.url (schema ids'
            " come from the registry)"
        )
    check_settings(s.cloudevents, s.value_format, s.null_payload)
    s._check_outboxes(explicit)
    outboxes = s.outbox_settings()
    statusless = [o for o in outboxes if not o.columns.has_status]
    if s.tracing_relay_span and all(o.columns.tracing_span_context is None for o in outboxes):
        raise ValueError("tracing_relay_span needs columns.tracing_span_context (the trace"
                         " context the relay span continues)")  # fmt: skip
    if s.tracing_relay_span and importlib.util.find_spec("opentelemetry") is None:
        raise ValueError("tracing_relay_span needs opentelemetry-api: pip install"
                         " 'cdc-outbox[otel]'")  # fmt: skip
    kept = [o for o in statusless if o.cdc_mark_published != "delete"]
    if s.delivery == "exactly_once" and kept:
        # Its catch-up marks (or deletes) each Kafka transaction's rows as it commits; a
        # statusless table can only have them deleted (docs/exactly-once.md).
        raise ValueError(
            f'delivery = "exactly_once": {kept[0].name} has no status columns, so it needs'
            ' cdc_mark_published = "delete" (its catch-up deletes rows as each Kafka'
            " transaction commits)"
        )
    resolve_mode(s)
    if statusless and s.on_permanent_error == "dead_letter":
        preset, name = statusless[0].columns.preset, statusless[0].name
        if "on_permanent_error" in explicit:
            raise ValueError(
                f'on_permanent_error = "dead_letter" needs the status columns of the'
                f" default column preset to park and redrive events; {name} (the {preset}"
                ' preset) has none: use on_permanent_error = "halt"'
            )
        return "halt"
    return "halt" if s.on_permanent_error == "halt" else "dead_letter"
