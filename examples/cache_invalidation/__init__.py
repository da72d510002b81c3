"""Cache invalidation with cdc-outbox: an order service, a Redis read cache, a consumer.

* :mod:`.orders` - the write side: every change of an order and its ``OrderUpdated`` event are
  written in one transaction (:func:`cdc_outbox.writer.write_event`).
* :mod:`.cache` - the read side: cache-aside over Redis, entries versioned by the order's
  ``version`` column; a write to the cache never replaces a newer entry with an older one.
* :mod:`.consumer` - ``cdc-outbox consume --handler examples.cache_invalidation.consumer:handle``
  refreshes the cached order from each event (idempotent, in order per order id).

See README.md in this directory.
"""
