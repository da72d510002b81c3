"""The polling fallback relay (FOR UPDATE SKIP LOCKED) and its SQL."""
