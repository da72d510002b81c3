"""The delivery policy, pure (no I/O): what may be sent, what is parked, what halts.

One rule for every mode (CDC streaming, snapshot catch-up, polling):

- **Order survives a failure.** Once an event of an aggregate is dead-lettered, every later
  event of that aggregate is *parked*: dead-lettered too, with reason ``blocked_by <event
  id>``, until ``cdc-outbox redrive`` releases the aggregate and re-publishes its events in
  their original order. :class:`Parking` is that per-aggregate memory; the durable truth is
  the outbox rows marked ``FAILED`` (loaded with :meth:`Parking.load`). Only events *after*
  the dead letter are parked: a re-stream that sends again events of the aggregate that came
  before it publishes them as the first time (:meth:`Parking.load_from_position`).
- **Poison is caught before the broker.** :func:`precheck` rejects what can be judged
  locally (a record larger than ``max_record_bytes``), so the common poison cases never
  reach Kafka and never race with later events of the same key.
- **Only record-level rejections are permanent.** A :class:`~cdc_outbox.kafka.publisher.
  DeliveryFailure` of kind ``DEAD_LETTER`` is dead-lettered (or halts, with the ``halt``
  policy); ``RETRY`` failures (a fatal producer's included) are retried from the last
  confirmed position, never dead-lettered (see :func:`on_failure`). The actions are the
  one vocabulary, :class:`cdc_outbox.errors.FailureClass` (``FailureAction`` here).
- **A schema problem is the record's; a registry outage is not.** Avro encoding
  (:mod:`cdc_outbox.avro.serializer`) that fails because the payload does not match its
  schema, or no schema exists for the event type, is permanent (dead letter or halt); a
  registry that cannot be asked is retried (:func:`on_encode_failure`), so the slot never
  passes an event that only waits for its schema.
- **Order is per outbox table.** Several outbox tables (issue 36) never share an aggregate's
  order: :func:`parking_key` puts each table's aggregates in a namespace of their own (the
  first outbox's, and table-less events', is the plain key).
- **Order broken is never silent.** A broker-side rejection that arrives after later records
  of the same key were already produced cannot be undone: :class:`KeysInFlight` notices it
  and the caller counts ``cdc_outbox_order_broken_total``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cdc_outbox.errors import Failure, FailureClass, Fault, classify
from cdc_outbox.kafka.delivery_failure import DeliveryFailure, Headers

__all__ = [
    "FailureAction",
    "KeysInFlight",
    "Parking",
    "blocked_reason",
    "on_encode_failure",
    "on_failure",
    "parking_key",
    "precheck",
    "table_aggregate",
]

#: Record overhead counted on top of key, value and headers (Kafka record framing).
RECORD_OVERHEAD_BYTES = 64


def parking_key(outbox: int, key: bytes | None) -> bytes | None:
    """The key :class:`Parking` and :class:`KeysInFlight` know an aggregate of outbox
    ``outbox`` by (an index in ``Settings.outbox_settings()``; table-less events: negative):
    the Kafka key itself for the first outbox and table-less events, else the key prefixed
    with ``NUL <outbox> NUL`` (an aggregate id is PostgreSQL text, which holds no NUL, so no
    plain key looks like it)."""
    if outbox <= 0 or key is None:
        return key
    return b"\x00%d\x00%b" % (outbox, key)


def table_aggregate(outbox: int, aggregate_id: str) -> str:
    """``aggregate_id`` of outbox ``outbox`` as :meth:`Parking.load` takes it: its UTF-8 is
    :func:`parking_key` of the aggregate's key."""
    return aggregate_id if outbox <= 0 else f"\x00{outbox}\x00{aggregate_id}"


def blocked_reason(event_id: str, own_id: str | None = None) -> str:
    """The dead-letter reason of event ``own_id`` parked behind ``event_id``; the blocker
    itself comes back only when its dead letter was not confirmed before a restart (an
    aborted Kafka transaction, a crash): it is dead-lettered again."""
    if event_id == own_id:
        return "already FAILED: dead-lettered again after a restart"
    return f"blocked_by {event_id}"


def precheck(
    key: bytes | None, value: bytes | None, headers: Headers, max_record_bytes: int
) -> str | None:
    """Why this record must not be produced (None: it may)."""
    if key is None:
        return "record has a null key (aggregate id)"
    size = len(key) + (len(value) if value is not None else 0) + RECORD_OVERHEAD_BYTES
    size += sum(len(name) + len(data) for name, data in headers)
    if size > max_record_bytes:
        return f"record too large: {size} bytes > max_record_bytes {max_record_bytes}"
    return None


#: What the policy decides: the one failure vocabulary (retry / dead-letter / halt).
FailureAction = FailureClass


def on_failure(failure: DeliveryFailure, halt_policy: bool) -> FailureAction:
    """What to do after Kafka refused a record: the record's own fault (``failure.kind``,
    :func:`cdc_outbox.errors.classify`'s verdict) is dead-lettered (or halts); anything else
    is retried, from a new session (a producer with a fatal error is replaced there:
    :meth:`~cdc_outbox.delivery.engine.Delivery.new_session`)."""
    return _with_policy(failure.kind, halt_policy)


def on_encode_failure(kind: str, halt_policy: bool) -> FailureAction:
    """What to do when a record could not be serialized: ``kind`` is ``"invalid"`` (the
    record's own fault) or ``"unavailable"`` (the schema registry could not be asked),
    classified by :func:`cdc_outbox.errors.classify`."""
    fault = Fault.SERVICE if kind == "unavailable" else Fault.RECORD
    return _with_policy(classify(Failure(fault)).kind, halt_policy)


def _with_policy(kind: FailureClass, halt_policy: bool) -> FailureAction:
    """``kind`` under ``on_permanent_error``: ``"halt"`` halts instead of dead-lettering."""
    if kind is FailureClass.DEAD_LETTER and halt_policy:
        return FailureAction.HALT
    return kind


class Parking:
    """Aggregates (Kafka keys) parked behind a dead-lettered event, and the events parked
    since the last load (to check that a redrive covered all of them).

    A key is parked from its blocker's position onward, never before it: a key parked in
    this run (:meth:`park`) blocks every later event of it; a key loaded from the table
    with :meth:`load_from_position` (CDC: a re-stream may send again events that came before
    the blocker, and the blocker itself) is parked only from the first event that is the
    blocker or does not precede it (``precedes``, the aggregate's order in the table); the
    events before it are sent as the first time."""

    __slots__ = ("_blocked", "_parked", "_pending")

    def __init__(self) -> None:
        self._blocked: dict[bytes, str] = {}
        self._pending: dict[bytes, str] = {}  # loaded: parked from the blocker's position on
        self._parked: dict[bytes, set[str]] = {}

    def __len__(self) -> int:
        return len(self._blocked) + len(self._pending)

    def blocked_by(
        self,
        key: bytes | None,
        event_id: str | None = None,
        precedes: Callable[[str, str], bool] | None = None,
    ) -> str | None:
        """The event id ``key``'s event ``event_id`` is parked behind, if any. For a key
        loaded with :meth:`load_from_position`, ``precedes(event_id, blocker)`` says whether
        the event comes before its blocker (then it is not parked; the first event that does
        not, or the blocker itself, parks the key for good). Without ``precedes`` every
        event of a loaded key is parked."""
        if key is None:
            return None
        blocker = self._blocked.get(key)
        if blocker is not None:
            return blocker
        blocker = self._pending.get(key)
        if blocker is None:
            return None
        if (
            event_id is not None
            and precedes is not None
            and event_id != blocker
            and precedes(event_id, blocker)
        ):
            return None
        del self._pending[key]
        self._blocked[key] = blocker
        return blocker

    def park(self, key: bytes | None, event_id: str) -> None:
        """Park ``key`` behind ``event_id`` (an already parked key keeps its first blocker; a
        key loaded from the table is parked from here on)."""
        if key is not None:
            self._pending.pop(key, None)
            self._blocked.setdefault(key, event_id)
            self._parked.setdefault(key, set()).add(event_id)

    def release(self, key: bytes, redriven_ids: frozenset[str] | set[str]) -> bool:
        """Release ``key`` if every event parked for it since the last load is among
        ``redriven_ids``; returns whether it was released (False: run redrive again)."""
        if not self._parked.get(key, set()) <= redriven_ids:
            return False
        self._blocked.pop(key, None)
        self._pending.pop(key, None)
        self._parked.pop(key, None)
        return True

    def load(self, rows: Iterable[tuple[str, str]]) -> None:
        """Replace the parked set by ``(aggregate_id, first FAILED event id)`` rows, every
        event of those aggregates parked (polling: its claimed rows follow the FAILED one)."""
        self._blocked = {agg.encode(): event_id for agg, event_id in rows}
        self._pending = {}
        self._parked = {}

    def load_from_position(self, rows: Iterable[tuple[str, str]]) -> None:
        """Replace the parked set by ``(aggregate_id, first FAILED event id)`` rows, each
        aggregate parked only from its blocker's position on (see :meth:`blocked_by`)."""
        self._blocked = {}
        self._pending = {agg.encode(): event_id for agg, event_id in rows}
        self._parked = {}


class KeysInFlight:
    """Records produced and not yet reported, per key (to detect a broken order)."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def add(self, key: bytes) -> None:
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1

    def done(self, key: bytes | None) -> int:
        """One record of ``key`` was reported; returns how many later ones are still out."""
        if key is None:
            return 0
        left = self._counts.get(key, 0) - 1
        if left > 0:
            self._counts[key] = left
        else:
            self._counts.pop(key, None)
            left = 0
        return left

    def clear(self) -> None:
        self._counts.clear()


def guarantee_in_effect(delivery: str, phase: str | None) -> str:
    """The delivery guarantee a relay gives in ``phase``: ``exactly_once`` only when so
    configured and not POLLING (a status update in PostgreSQL cannot commit atomically with
    a Kafka transaction, so polling is at-least-once in every case)."""
    if delivery == "exactly_once" and phase != "POLLING":
        return "exactly_once"
    return "at_least_once"
