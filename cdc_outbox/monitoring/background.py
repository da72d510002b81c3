"""A daemon thread running one sampling loop, started and stopped the same way everywhere
(slot monitor, heartbeat, health checks)."""

from __future__ import annotations

import threading


class BackgroundLoop:
    """Subclasses implement :meth:`_run`, which must return soon after ``_stop`` is set."""

    thread_name = "background"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the loop to end and wait up to ``timeout`` seconds for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        raise NotImplementedError
