"""A thin adapter over ``confluent_kafka.schema_registry.SchemaRegistryClient``.

The library does the HTTP (auth, timeouts, caching of ids and registrations); this module only
fixes what the delivery policy needs. Errors are split so:

- :class:`RegistryUnavailable`: no answer (connection refused, timeout, any other transport
  error of the library's HTTP stack, an unreadable answer) or HTTP 5xx/408/429: an outage, try
  again later;
- :class:`RegistryError`: any other error answer, with ``status`` and the registry's
  ``error_code`` (404 subject or version not found, 409 incompatible, 422 invalid schema).

The library's own retries are off (``max.retries`` 0): the relay and the consumer retry with
their own backoff. :meth:`RegistryClient.latest` always asks the registry (the library caches
latest versions forever). Credentials (``user:password``) go to the library as
``basic.auth.user.info`` and never into messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

__all__ = ["RegistryClient", "RegistryError", "RegistryUnavailable"]

_T = TypeVar("_T")
_OUTAGE_STATUS = frozenset({408, 429})


class RegistryUnavailable(Exception):
    """The registry did not answer usefully (connection, timeout, 5xx): try again later."""


class RegistryError(Exception):
    """The registry answered with an error (``status``, ``error_code``)."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(f"HTTP {status} ({error_code}): {message}")
        self.status = status
        self.error_code = error_code
        self.message = message


def _call(fn: Callable[[], _T]) -> _T:
    """``fn()``, its exceptions translated into the two above."""
    try:
        return fn()
    except SchemaRegistryError as exc:
        status = int(exc.http_status_code)
        if status >= 500 or status in _OUTAGE_STATUS:
            raise RegistryUnavailable(f"schema registry answered HTTP {status}") from None
        code = status if exc.error_code in (None, -1) else int(exc.error_code)
        raise RegistryError(status, code, str(exc.error_message or "")[:300]) from None
    except Exception as exc:  # the library's HTTP stack (httpx or httpx2): transport errors,
        # a garbled answer; it raises nothing else, so all of it is "no useful answer"
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise RegistryUnavailable(f"schema registry unreachable: {reason}") from None


class RegistryClient:
    """Confluent-compatible registry at ``url`` (e.g. ``http://host:8080/apis/ccompat/v7``)."""

    def __init__(self, url: str, user_info: str = "", timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        conf: dict[str, Any] = {"url": self.url, "timeout": timeout, "max.retries": 0}
        if user_info:
            conf["basic.auth.user.info"] = user_info
        self.client = SchemaRegistryClient(conf)
        for name in ("httpx", "httpx2"):  # the library's HTTP stack logs every request at INFO
            http_logger = logging.getLogger(name)
            if http_logger.level == logging.NOTSET:
                http_logger.setLevel(logging.WARNING)

    def register(self, subject: str, schema: str) -> int:
        """Register ``schema`` under ``subject`` (idempotent, cached); its global id."""
        return int(_call(lambda: self.client.register_schema(subject, Schema(schema, "AVRO"))))

    def lookup(self, subject: str, schema: str) -> int:
        """The id of ``schema`` if already registered under ``subject`` (404 otherwise)."""
        got: Any = _call(lambda: self.client.lookup_schema(subject, Schema(schema, "AVRO")))
        return int(got.schema_id)

    def latest(self, subject: str) -> tuple[int, str]:
        """``(id, schema text)`` of the latest version of ``subject`` (404 if none), asked of
        the registry every time."""

        def ask() -> Any:
            self.client.clear_latest_caches()  # type: ignore[no-untyped-call]
            return self.client.get_latest_version(subject)

        got = _call(ask)
        return int(got.schema_id), str(got.schema.schema_str)

    def schema(self, schema_id: int) -> str:
        """The schema text with global id ``schema_id`` (cached by the library)."""
        return str(_call(lambda: self.client.get_schema(int(schema_id))).schema_str)

    def compatibility(self, subject: str) -> str:
        """The compatibility level in force for ``subject`` (its own, else the global one)."""
        try:
            return str(_call(lambda: self.client.get_compatibility(subject)))
        except RegistryError as exc:
            if exc.status != 404:
                raise
        return str(_call(self.client.get_compatibility) or "BACKWARD")

    def test_compatibility(self, subject: str, schema: str) -> tuple[bool, list[str]]:
        """Whether ``schema`` may follow ``subject``'s latest version, with the reasons.
        A subject without versions is compatible.

        The library's ``test_compatibility`` returns only the verdict, so this one request
        goes through its REST layer (same auth, timeout and errors) to keep the reasons."""
        path = f"compatibility/subjects/{quote(subject, safe='')}/versions/latest?verbose=true"
        body = Schema(schema, "AVRO").to_dict()
        try:
            out = _call(lambda: self.client._rest_client.post(path, body=body))
        except RegistryError as exc:
            if exc.status == 404:
                return True, []
            raise
        return bool(out.get("is_compatible")), [str(m) for m in out.get("messages") or []]

    def close(self) -> None:
        """Close the HTTP session."""
        self.client.close()
