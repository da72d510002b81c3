"""CDC streaming: replication stream -> pgoutput decoder -> relay -> ack tracker/checkpoint."""
