"""Avro values in the Confluent wire format: codec (:mod:`.wire`, reusable by consumers),
registry client (:mod:`.registry`) and the relay's serializer (:mod:`.serializer`)."""
