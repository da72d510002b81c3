"""Kafka: the one module that talks to the broker."""
