"""The CloudEvents settings that cannot work together, checked when the settings are read."""

from __future__ import annotations

import importlib.util

__all__ = ["check_settings"]


def check_settings(mode: str, value_format: str, null_payload: str) -> None:
    """CloudEvents combinations that make no sense, and a missing SDK (ValueError, one line)."""
    if mode == "off":
        return
    if importlib.util.find_spec("cloudevents") is None:
        raise ValueError(
            f"cloudevents = {mode!r} needs the cloudevents SDK:"
            " pip install 'cdc-outbox[cloudevents]'"
        )
    if mode == "structured" and value_format == "avro":
        raise ValueError(
            'cloudevents = "structured" puts a JSON envelope in the value: it cannot be'
            ' value_format = "avro" (use cloudevents = "binary")'
        )
    if mode == "structured" and null_payload == "tombstone":
        raise ValueError(
            'cloudevents = "structured" never publishes a null value: null_payload ='
            ' "tombstone" needs cloudevents = "binary" or "off"'
        )
