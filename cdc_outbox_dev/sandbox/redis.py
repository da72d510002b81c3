"""A local Redis server (Debian's ``redis-server``) for tests and the cache example.

Loopback only, a free port, no persistence (no RDB, no AOF), a temporary working directory.
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from cdc_outbox_dev.sandbox import _proc
from cdc_outbox_dev.sandbox._lifecycle import LocalServer

logger = logging.getLogger(__name__)

__all__ = ["LocalRedis"]


def find_redis_server() -> str:
    path = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if path is None:
        raise RuntimeError("redis-server not found: run scripts/bootstrap.sh (apt redis-server)")
    return path


class LocalRedis(LocalServer):
    """``with LocalRedis() as r:`` -> ``r.url`` (``redis://127.0.0.1:<port>/0``)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or _proc.free_port()
        self.base_dir = Path(tempfile.mkdtemp(prefix="cdc-outbox-redis-"))
        self._owns_dir = True
        self.logfile = self.base_dir / "redis.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 30.0) -> None:
        """Start and wait until it answers PING (a no-op when running)."""
        if self.is_running():
            return
        _proc.wait_port_free(self.port)
        args = [
            find_redis_server(),
            "--bind", "127.0.0.1", "--port", str(self.port), "--protected-mode", "yes",
            "--save", "", "--appendonly", "no", "--dir", str(self.base_dir),
            "--logfile", str(self.logfile), "--daemonize", "no",
        ]  # fmt: skip
        self._proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        proc = self._proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited with {proc.returncode}:\n{_proc.tail(self.logfile)}"
                )
            return _ping(self.port)

        _proc.wait_for(ready, timeout, "Redis to answer PING")
        logger.info("Redis ready on 127.0.0.1:%d (pid %d)", self.port, proc.pid)

    def stop(self, timeout: float = 30.0) -> None:
        if self._proc is not None and self._proc.poll() is None:
            _proc.terminate(self._proc.pid, signal.SIGTERM, timeout, self._proc)
        self._proc = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False
