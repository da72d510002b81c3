"""The long-running service behind ``cdc-outbox run``: the one place that wires the relay
with its monitoring (metrics endpoint, dashboard, slot monitor, heartbeat).

Contract: :func:`run_service` returns when :meth:`Service.request_stop` was called and the
relay has flushed and confirmed (see :mod:`cdc_outbox.relay`); it raises what the relay raises.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack

from cdc_outbox.config import Settings
from cdc_outbox.relay import Relay

logger = logging.getLogger(__name__)


class Service:
    """A relay plus its monitoring; ``request_stop`` may be called from a signal handler."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.relay = Relay(settings)

    def request_stop(self) -> None:
        self.relay.request_stop()

    def run(self) -> None:
        with ExitStack() as stack:
            if self.settings.metrics_port:
                from cdc_outbox.monitoring import start_monitoring

                stack.enter_context(start_monitoring(self.settings, lambda: self.relay.stats))
            self.relay.run()
