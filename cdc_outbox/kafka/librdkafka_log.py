"""librdkafka's log lines through :mod:`logging`, rate-limited per distinct line."""

from __future__ import annotations

import logging
import time


class QuietLibrdkafkaLog:
    """librdkafka's log lines, each distinct line at most once per ``interval_s``.

    While a broker is down librdkafka logs every reconnect attempt; the relay's own
    rate-limited warnings (``error_cb``) already say so.
    """

    def __init__(
        self,
        interval_s: float = 30.0,
        max_level: int = logging.WARNING,
        name: str = "cdc_outbox.librdkafka",
    ) -> None:
        self._logger = logging.getLogger(name)
        self._interval_s = interval_s
        self._max_level = max_level
        self._last: dict[str, float] = {}

    def log(self, level: int, msg: str, *args: object) -> None:
        text = msg % args if args else msg
        key = text[:80]
        now = time.monotonic()
        if now - self._last.get(key, -self._interval_s) < self._interval_s:
            return
        if len(self._last) > 1000:
            self._last.clear()
        self._last[key] = now
        self._logger.log(min(level, self._max_level), "%s", text)
