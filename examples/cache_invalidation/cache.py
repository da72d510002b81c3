"""The read side: cache-aside over Redis with version-guarded writes.

Plain "read DB, then SET" has a race: a reader that loaded version 3 may store it after the
consumer stored version 4, and the cache stays stale until the entry expires. Here every
write to the cache (a reader filling a miss, the consumer refreshing from an event) goes
through :data:`PUT_IF_NEWER`, a Lua script that keeps the entry with the higher ``version``,
so the cache only moves forward and, once the consumer has applied an order's last event,
holds that order's current row (or nothing).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import redis

from examples.cache_invalidation.orders import load_order

TTL_S = 3600
PUT_IF_NEWER = """
local current = redis.call('GET', KEYS[1])
if current then
  local ok, decoded = pcall(cjson.decode, current)
  if ok and tonumber(decoded['version']) >= tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
return 1
"""


def cache_key(order_id: str) -> str:
    return f"order:{order_id}"


class OrderCache:
    """``get`` (cache-aside read) and ``put`` (version-guarded write) of orders in Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._put = client.register_script(PUT_IF_NEWER)

    def put(self, order: dict[str, Any]) -> bool:
        """Store ``order`` unless the cache holds the same or a newer version."""
        text = json.dumps(order, sort_keys=True)
        stored = self._put(keys=[cache_key(order["id"])], args=[text, order["version"], TTL_S])
        return bool(stored)

    def cached(self, order_id: str) -> dict[str, Any] | None:
        raw = self.client.get(cache_key(order_id))
        return None if raw is None else dict(json.loads(raw))

    def get(self, conn: psycopg.Connection[Any], order_id: str) -> dict[str, Any] | None:
        """The order: from Redis, else from PostgreSQL (and then cached)."""
        hit = self.cached(order_id)
        if hit is not None:
            return hit
        row = load_order(conn, order_id)
        conn.rollback()  # end the read-only transaction
        if row is not None:
            self.put(row)
        return row
