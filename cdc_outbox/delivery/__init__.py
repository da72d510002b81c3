"""The delivery policy and its engine, shared by every mode; dead letters and redrive."""
