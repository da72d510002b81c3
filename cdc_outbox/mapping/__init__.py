"""An outbox row becomes a Kafka record (pure): the row mapper, CloudEvents, headers."""
