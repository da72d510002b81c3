"""Fakes of the relay's ports (cdc_outbox.cdc.relay_ports): a PostgreSQL with one slot and a
Kafka cluster with transactions, in memory, so unit tests drive the real Relay through every
restart path deterministically and in milliseconds. They model what the relay relies on and
nothing more; integration tests keep the real servers."""
