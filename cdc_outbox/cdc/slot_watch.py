"""Is the slot a streaming session is about to start still the one the relay was streaming?

The service decides at its start whether the slot may be streamed as it is or needs a
catch-up (:func:`~cdc_outbox.cdc.catch_up_rule.catch_up_reason`). A relay re-streams many
times after that (a dropped replication connection, a Kafka error), and meanwhile someone may
drop and recreate the slot (or ``init`` may, and write ``CATCHING_UP``): the new slot starts
at a consistent point past the rows committed in the gap, which streaming it would skip.

Contract of :class:`SlotWatch`: :meth:`~SlotWatch.check` is called at every session start,
before the stream starts. The first call records whether the rule held (a relay run by the
service: it did, the service just applied it); from then on, if it held, a session start
where it no longer holds raises :class:`SlotChanged` (the service then catches up), so the
recreated slot is never streamed. A relay whose first session did not pass the rule (run
outside the service, e.g. right after :meth:`~cdc_outbox.cdc.relay.Relay.catch_up` by a test)
is not checked. Like the rule, nothing is detected when the state table cannot keep positions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cdc_outbox.cdc.catch_up_rule import catch_up_reason
from cdc_outbox.errors import CdcOutboxError
from cdc_outbox.store.relay_state import SlotFacts

__all__ = ["SlotChanged", "SlotWatch"]

logger = logging.getLogger(__name__)


class SlotChanged(CdcOutboxError):
    """The slot can no longer be streamed as it is (the catch-up rule's reason): catch up."""


class SlotWatch:
    """The catch-up rule at every session start (see the module contract)."""

    __slots__ = ("_facts", "_held")

    def __init__(self, facts: Callable[[], SlotFacts]) -> None:
        self._facts = facts
        self._held: bool | None = None  # did the rule hold at the first session start?

    def check(self) -> None:
        """Raises :class:`SlotChanged`, or what reading the facts raised (``psycopg.Error``,
        ``DatabaseUnavailable``)."""
        facts = self._facts()
        reason = catch_up_reason(facts.state, facts.slot, keeps_position=facts.keeps_position)
        if self._held is None:
            self._held = reason is None
            if reason is not None:
                logger.debug("slot not checked between sessions (%s at the first one)", reason)
            return
        if reason is not None and self._held:
            raise SlotChanged(f"the slot changed while the relay was between sessions: {reason}")
