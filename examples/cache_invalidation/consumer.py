"""The cache-refreshing handler: ``cdc-outbox consume --handler
examples.cache_invalidation.consumer:handle`` with ``ORDERS_REDIS_URL`` set.

Each ``OrderUpdated`` event carries the order row as written in the order's transaction; the
handler stores it with the version guard, so applying an event twice, or an older one after a
newer one, changes nothing. The consumer runs it once per event anyway (``processed_events``)
and in order per order id (the Kafka key).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import psycopg
import redis

from cdc_outbox.consumer import Event
from examples.cache_invalidation.cache import OrderCache


@functools.cache
def _cache() -> OrderCache:
    return OrderCache(redis.Redis.from_url(os.environ["ORDERS_REDIS_URL"]))


def handle(conn: psycopg.Connection[Any], event: Event) -> None:
    """Refresh the cached order from the event's row (events of other aggregates: ignored).

    No plain DELETE of the key: a reader that loaded an older row could put it back after the
    delete. A versioned refresh cannot be undone by an older write."""
    row = event.payload
    if event.aggregate_type == "order" and isinstance(row, dict) and {"id", "version"} <= set(row):
        _cache().put(row)
