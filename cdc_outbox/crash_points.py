"""Named crash points for fault tests: a real ``kill -9`` at an exact step.

With ``CDC_OUTBOX_CRASH_AT=<name>`` in its environment, the process sends itself SIGKILL when
it reaches :func:`crash_point` with that name (e.g. ``catch_up.slot_created``,
``catch_up.before_streaming``). Without the variable it does nothing; nothing else reads it.
"""

from __future__ import annotations

import logging
import os
import signal

logger = logging.getLogger(__name__)

ENV = "CDC_OUTBOX_CRASH_AT"


def crash_point(name: str) -> None:
    """SIGKILL this process if ``$CDC_OUTBOX_CRASH_AT`` names this point."""
    if os.environ.get(ENV) == name:
        logger.warning("crash point %s: killing the process (SIGKILL)", name)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
