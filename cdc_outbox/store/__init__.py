"""The outbox database's own tables: DDL, inspection, relay state, processed_events."""
