"""CDC streaming: replication stream -> pgoutput (pgwire/) -> relay -> ack tracker, checkpoint."""
