"""The cdc-outbox development harness: local PostgreSQL + Kafka (``sandbox``), sample traffic
and its verification (``workload``, ``readback``), the end-to-end ``demo`` and its CLI.

It lives in the repository only; the ``cdc-outbox`` wheel ships the relay and the admin CLI.
"""
