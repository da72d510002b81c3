"""One active instance: leader election and the persisted relay phase."""
