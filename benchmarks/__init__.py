"""cdc-outbox benchmarks: ``python -m benchmarks relay|compare ...``.

Each command prints a table and writes JSON; figures are ratios measured in the same run.
"""
