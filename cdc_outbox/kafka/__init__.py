"""Kafka: the only package that talks to the broker (the relay's publisher, the consumer's side)."""
