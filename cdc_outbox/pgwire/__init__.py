"""PostgreSQL logical replication wire format: walsender framing and pgoutput decoding (pure)."""
