"""cdc-outbox: a transactional-outbox relay from PostgreSQL logical replication to Kafka.

Delivery is at-least-once: a replication slot position is confirmed only after Kafka has
acknowledged every event of every transaction up to it, so a crash re-sends, never skips.
"""

__version__ = "0.1.0"
