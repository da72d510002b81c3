"""cdc-outbox benchmarks: ``python -m benchmarks NAME [options]`` (:mod:`benchmarks.cli`).

Each benchmark prints a table and writes JSON; figures are ratios measured in the same run.
"""
