"""The relay's counters, progress and OpenTelemetry spans (no project imports below)."""
