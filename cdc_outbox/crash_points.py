"""Named crash points for fault tests: a real ``kill -9`` at an exact step.

With ``CDC_OUTBOX_CRASH_AT=<name>`` in its environment, the process sends itself SIGKILL when
it reaches :func:`crash_point` with that name (e.g. ``catch_up.slot_created``,
``catch_up.before_streaming``). Without the variable it does nothing; nothing else reads it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)

ENV = "CDC_OUTBOX_CRASH_AT"


def crash_point(name: str) -> None:
    """SIGKILL this process if ``$CDC_OUTBOX_CRASH_AT`` names this point."""
    if os.environ.get(ENV) == name:
        _kill(name, "")


@contextmanager
def crash_during(name: str, delay_s: float = 0.001) -> Iterator[None]:
    """SIGKILL this process ``delay_s`` into the block if ``$CDC_OUTBOX_CRASH_AT`` names this
    point: a kill while a blocking call (e.g. a Kafka commit) is in flight. Should the block
    end first, nothing after it runs: the block's exit waits for the kill."""
    if os.environ.get(ENV) != name:
        yield
        return
    inside = threading.Event()
    inside.set()
    timer = threading.Timer(
        delay_s, lambda: _kill(name, "" if inside.is_set() else " (after the call returned)")
    )
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        inside.clear()
        timer.join()


def _kill(name: str, note: str) -> None:
    logger.warning("crash point %s: killing the process (SIGKILL)%s", name, note)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)
