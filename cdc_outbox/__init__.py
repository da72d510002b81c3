"""cdc-outbox: a transactional-outbox relay from PostgreSQL logical replication to Kafka.

Delivery is at-least-once by default: a replication slot position is confirmed only after
Kafka has acknowledged every event of every transaction up to it, so a crash re-sends, never
skips. With ``delivery = "exactly_once"`` whole PostgreSQL transactions are committed in Kafka
transactions together with an LSN checkpoint, so ``read_committed`` consumers see each event
once (docs/exactly-once.md). The two ends of the pattern ship too: the application's writer
(:mod:`cdc_outbox.writer`) and an idempotent consumer (:mod:`cdc_outbox.consumer`).
"""

__version__ = "0.1.0"
