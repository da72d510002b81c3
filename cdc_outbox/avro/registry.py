"""A small client of the Confluent Schema Registry REST API (stdlib HTTP, no retries).

Errors are split the way the delivery policy needs them:

- :class:`RegistryUnavailable`: no answer, a timeout, or HTTP 5xx/408/429 (an outage: retry);
- :class:`RegistryError`: any other non-2xx answer, with ``status`` and the registry's
  ``error_code`` (404 subject or version not found, 409 incompatible, 422 invalid schema).

Credentials (``user:password``) go into an ``Authorization`` header and never into messages.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["RegistryClient", "RegistryError", "RegistryUnavailable"]

_CT = "application/vnd.schemaregistry.v1+json"


class RegistryUnavailable(Exception):
    """The registry did not answer usefully (connection, timeout, 5xx): try again later."""


class RegistryError(Exception):
    """The registry answered with an error (``status``, ``error_code``)."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(f"HTTP {status} ({error_code}): {message}")
        self.status = status
        self.error_code = error_code
        self.message = message


class RegistryClient:
    """Confluent-compatible registry at ``url`` (e.g. ``http://host:8080/apis/ccompat/v7``)."""

    def __init__(self, url: str, user_info: str = "", timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Content-Type": _CT, "Accept": _CT}
        if user_info:
            token = base64.b64encode(user_info.encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers=self._headers
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            status = exc.code
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RegistryUnavailable(f"schema registry unreachable: {reason}") from None
        if status >= 500 or status in (408, 429):
            raise RegistryUnavailable(f"schema registry answered HTTP {status}")
        try:
            info = json.loads(raw)
            code, message = int(info.get("error_code", status)), str(info.get("message", ""))
        except (ValueError, AttributeError, TypeError):
            code, message = status, raw[:200].decode(errors="replace")
        raise RegistryError(status, code, message)

    @staticmethod
    def _subject(subject: str) -> str:
        return urllib.parse.quote(subject, safe="")

    def register(self, subject: str, schema: str) -> int:
        """Register ``schema`` under ``subject`` (idempotent); its global id."""
        out = self._call("POST", f"/subjects/{self._subject(subject)}/versions", {"schema": schema})
        return int(out["id"])

    def lookup(self, subject: str, schema: str) -> int:
        """The id of ``schema`` if already registered under ``subject`` (404 otherwise)."""
        out = self._call("POST", f"/subjects/{self._subject(subject)}", {"schema": schema})
        return int(out["id"])

    def latest(self, subject: str) -> tuple[int, str]:
        """``(id, schema text)`` of the latest version of ``subject`` (404 if none)."""
        out = self._call("GET", f"/subjects/{self._subject(subject)}/versions/latest")
        return int(out["id"]), str(out["schema"])

    def schema(self, schema_id: int) -> str:
        """The schema text with global id ``schema_id``."""
        return str(self._call("GET", f"/schemas/ids/{int(schema_id)}")["schema"])

    def compatibility(self, subject: str) -> str:
        """The compatibility level in force for ``subject`` (its own, else the global one)."""
        try:
            out = self._call("GET", f"/config/{self._subject(subject)}?defaultToGlobal=true")
        except RegistryError as exc:
            if exc.status != 404:
                raise
            out = self._call("GET", "/config")
        return str(out.get("compatibilityLevel") or out.get("compatibility") or "BACKWARD")

    def test_compatibility(self, subject: str, schema: str) -> tuple[bool, list[str]]:
        """Whether ``schema`` may follow ``subject``'s latest version, with the reasons.
        A subject without versions is compatible."""
        path = f"/compatibility/subjects/{self._subject(subject)}/versions/latest?verbose=true"
        try:
            out = self._call("POST", path, {"schema": schema})
        except RegistryError as exc:
            if exc.status == 404:
                return True, []
            raise
        return bool(out.get("is_compatible")), [str(m) for m in out.get("messages") or []]
