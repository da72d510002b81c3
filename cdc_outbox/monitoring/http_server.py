"""The relay's HTTP endpoint (read-only, GET only): metrics, lag API and the dashboard.

Routes:
- ``/metrics``: Prometheus text exposition of the relay's registry.
- ``/api/lag``: ``{"current": <LagSample dict or null>, "chart": [points], "refresh_seconds",
  "slot_name"}``; ``?since=<unix>`` returns only chart points sampled after it.
- ``/dashboard`` (and ``/``): the lag dashboard; ``/dashboard/<asset>`` its packaged files.
- ``/healthz``: liveness, ``/readyz``: readiness (JSON; 200 or 503; see
  :mod:`cdc_outbox.monitoring.health`). Without health checks ``/healthz`` answers 200 and
  ``/readyz`` 503.

Bound to ``metrics_host`` (127.0.0.1 by default). Serves from daemon threads; :meth:`close`
stops it.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from cdc_outbox.monitoring.health import HealthChecks
from cdc_outbox.monitoring.slot_monitor import SlotMonitor

logger = logging.getLogger(__name__)

#: Packaged dashboard files and their content types.
ASSETS = {
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:",
    "Referrer-Policy": "no-referrer",
}


def load_asset(name: str) -> bytes:
    return resources.files("cdc_outbox.monitoring").joinpath("static", name).read_bytes()


def _finite(value: Any) -> Any:
    """JSON has no NaN/Infinity: map them to null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MonitoringServer:
    """HTTP server in a background thread; ``port`` is the bound port."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        monitor: SlotMonitor | None,
        health: HealthChecks | None = None,
    ) -> None:
        self.registry = registry
        self.monitor = monitor
        self.health = health
        self._assets = {name: load_asset(name) for name in ASSETS}
        handler = _handler_class(self)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="metrics-http"
        )
        self._thread.daemon = True

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        self._thread.start()
        logger.info("metrics on %s/metrics, dashboard on %s/dashboard", self.url, self.url)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def lag_document(self, since: float | None) -> dict[str, Any]:
        monitor = self.monitor
        latest = monitor.latest if monitor is not None else None
        current = None
        if latest is not None:
            current = {k: _finite(v) for k, v in latest.to_dict().items()}
        chart = []
        if monitor is not None:
            chart = [{k: _finite(v) for k, v in p.items()} for p in monitor.chart(since or 0.0)]
        return {
            "current": current,
            "chart": chart,
            "refresh_seconds": min(5.0, monitor.interval_s) if monitor is not None else 5.0,
            "slot_name": latest.slot_name if latest is not None else None,
        }

    def asset(self, name: str) -> bytes:
        return self._assets[name]

    def probe(self, path: str) -> tuple[int, bytes]:
        """Status and JSON body of ``/healthz`` or ``/readyz``."""
        health = self.health
        if health is None:
            ok, body = path == "/healthz", {"status": "no health checks"}
        else:
            ok, body = health.liveness() if path == "/healthz" else health.readiness()
        return (200 if ok else 503), json.dumps(body, allow_nan=False).encode() + b"\n"


def _handler_class(server: MonitoringServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "cdc-outbox"
        sys_version = ""

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            path = url.path.rstrip("/") or "/"
            try:
                if path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(server.registry))
                elif path == "/api/lag":
                    since = _float_param(parse_qs(url.query).get("since"))
                    body = json.dumps(server.lag_document(since), allow_nan=False).encode()
                    self._send(200, "application/json", body)
                elif path in ("/", "/dashboard"):
                    self._send(200, ASSETS["dashboard.html"], server.asset("dashboard.html"))
                elif path.startswith("/dashboard/") and path[11:] in ASSETS:
                    name = path[11:]
                    self._send(200, ASSETS[name], server.asset(name))
                elif path in ("/healthz", "/readyz"):
                    code, body = server.probe(path)
                    self._send(code, "application/json", body)
                else:
                    self._send(404, "text/plain; charset=utf-8", b"not found\n")
            except Exception:  # never let a request kill the server thread
                logger.exception("error serving %s", url.path)
                self._send(500, "text/plain; charset=utf-8", b"internal error\n")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for key, value in _SECURITY_HEADERS.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("http: " + format, *args)

    return Handler


def _float_param(values: list[str] | None) -> float | None:
    if not values:
        return None
    try:
        value = float(values[0])
    except ValueError:
        return None
    return value if math.isfinite(value) else None
