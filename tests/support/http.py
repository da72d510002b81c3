"""HTTP against a relay's monitoring endpoint (``metrics_host:metrics_port``)."""

from __future__ import annotations

import urllib.error
import urllib.request

from cdc_outbox.config.settings import Settings


def get(url: str) -> tuple[int, str, bytes]:
    """(status, Content-Type, body) of a GET; an HTTP error status is returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def endpoint_answers(settings: Settings) -> bool:
    """True once ``/healthz`` of the relay configured by ``settings`` answers 200."""
    try:
        return get(f"http://127.0.0.1:{settings.metrics_port}/healthz")[0] == 200
    except OSError:
        return False
