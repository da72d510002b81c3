"""Whether the slot can be streamed as it is, or a catch-up (new slot + snapshot) is needed.

Pure: no I/O. Contract of :func:`catch_up_reason` (None: stream the slot as it is):

- no slot, or an invalidated one (:mod:`cdc_outbox.ha.slot_invalidation`): catch up;
- a durable phase other than ``STREAMING`` (``CATCHING_UP`` left by ``init`` over a table with
  unpublished rows or by a crash mid catch-up, ``POLLING``, no state row): catch up;
- ``STREAMING``: stream, unless the slot is confirmed past every position this relay recorded
  for it, ``max(consistent_point, confirmed_lsn)``. The slot a relay streams is only ever
  confirmed to positions kept in ``confirmed_lsn`` first (or to the consistent point it was
  created at), so a slot past them was made by someone else, later: rows committed between
  our last position and its consistent point would be skipped. When the state table cannot
  keep positions (``keeps_position`` false: a table made by an older ``init``) this check is
  not possible and the slot is streamed, as before.

  On a promoted standby (17+) a synchronized copy of our own slot can be past the replicated
  ``confirmed_lsn`` too: the copy follows the primary's slot as far as the standby has
  flushed WAL, while the ``confirmed_lsn`` update for that position was committed after the
  position itself and may not have reached the standby. Nothing on the promoted server tells
  that copy from a slot someone else recreated on the old primary (also synchronized, also
  ``synced``), nor bounds how far ahead a genuine copy can be, so the rule stays as it is: a
  catch-up (safe: 0 lost, the duplicates of a failover without a failover slot) rather than
  streaming a slot that may skip rows (docs/failover.md).

``init`` writes ``STREAMING`` at the consistent point of the slot it creates when the table had
no unpublished row once the slot existed (every row committed before the consistent point was
published, so the slot alone delivers everything): the first ``run`` streams that slot
instead of dropping it for a catch-up.
"""

from __future__ import annotations

from cdc_outbox.ha.slot_invalidation import of_slot_status
from cdc_outbox.lsn import Lsn
from cdc_outbox.store.inspection import SlotStatus
from cdc_outbox.store.relay_state import Phase, RelayState

__all__ = ["catch_up_reason"]


def catch_up_reason(
    state: RelayState, slot: SlotStatus | None, *, keeps_position: bool = True
) -> str | None:
    """Why a catch-up is needed (one line for the log), or None to stream the slot."""
    if slot is None:
        return "the slot does not exist"
    if (invalidated := of_slot_status(slot)) is not None:
        return f"the slot was invalidated ({invalidated.reason})"
    if not state.exists:
        return "no relay state recorded for the slot"
    if state.phase is not Phase.STREAMING:
        return f"phase {state.phase}"
    flushed = slot.confirmed_flush_lsn
    if not keeps_position or flushed is None or state.consistent_point is None:
        return None
    recorded = max(state.consistent_point, state.confirmed_lsn or Lsn(0))
    if flushed > recorded:
        return (
            f"the slot is confirmed up to {Lsn(flushed)}, past every position this relay"
            f" recorded for it ({Lsn(recorded)}): it was recreated by someone else, or it is"
            " a synchronized copy promoted before the standby had the recorded position"
            " (docs/failover.md)"
        )
    return None
