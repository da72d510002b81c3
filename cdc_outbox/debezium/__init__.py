"""Reading a Debezium connector configuration into cdc-outbox settings (pure)."""
