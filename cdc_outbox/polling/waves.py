"""Per-aggregate order across topics within one polling batch (pure, no I/O).

Records of one aggregate on one topic share a partition (the key picks it), so Kafka keeps
their order and a failure of one fails the later ones with it. Records of one aggregate on
different topics (``topic_template`` with ``{event_type}``) do not: the later one may be
acknowledged while the earlier one fails. So a batch is sent in *waves*: a row waits for the
next wave when an earlier row of its aggregate goes to another topic in this wave (or already
waits), and after a wave the waiting rows of an aggregate whose row was not published nor
dead-lettered (retried, given back) are given back unsent: nothing overtakes a row that will
be sent again. Rows the mapper rejected (no topic) never hold anything: they are
dead-lettered at once and park their aggregate, so the rows after them are dead-lettered
``blocked_by`` them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol, TypeVar

__all__ = ["held_back", "next_wave"]


class Waved(Protocol):
    """What the waves need of a claimed row."""

    @property
    def aggregate_id(self) -> str: ...

    @property
    def outcome(self) -> str | None: ...


R = TypeVar("R", bound=Waved)


def next_wave(
    items: Sequence[tuple[R, str | None]],
) -> tuple[list[R], list[tuple[R, str | None]]]:
    """Split ``items`` (claimed rows with their record's topic, in claim order) into the rows
    to send now and the items that wait: per aggregate, the rows before its first row on a
    second topic go now, the rest wait."""
    topics: dict[str, str] = {}
    waiting: set[str] = set()
    now: list[R] = []
    later: list[tuple[R, str | None]] = []
    for item in items:
        row, topic = item
        agg = row.aggregate_id
        if agg not in waiting and (topic is None or topics.setdefault(agg, topic) == topic):
            now.append(row)
        else:
            waiting.add(agg)
            later.append(item)
    return now, later


def held_back(
    later: Sequence[tuple[R, str | None]], sent: Sequence[R], settled: Collection[str]
) -> tuple[list[tuple[R, str | None]], list[R]]:
    """After a wave: (the items that may go on, the rows given back unsent). A waiting row is
    given back when a row of its aggregate in the wave ``sent`` has an outcome outside
    ``settled`` (published, dead-lettered)."""
    stuck = {r.aggregate_id for r in sent if r.outcome not in settled}
    go_on = [item for item in later if item[0].aggregate_id not in stuck]
    back = [item[0] for item in later if item[0].aggregate_id in stuck]
    return go_on, back
