"""A run of the relay: checks before it, the phase machine and restarts, housekeeping."""
