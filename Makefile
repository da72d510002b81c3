# Entry points; each first runs scripts/bootstrap.sh (idempotent, fast once set up).
#   make demo   - the end-to-end demo on local PostgreSQL + Kafka
#   make test   - the full test suite (real PostgreSQL and Kafka, no Docker)
#   make lint   - ruff + mypy --strict
#   make bench  - both benchmarks (relay vs raw slot drain; CDC vs polling), JSON in benchmarks/out
VENV := .venv
PYTEST_ARGS ?=

.PHONY: bootstrap demo test lint bench

bootstrap:
	scripts/bootstrap.sh

demo: bootstrap
	$(VENV)/bin/cdc-outbox demo

test: bootstrap
	$(VENV)/bin/pytest -p no:cacheprovider -q $(PYTEST_ARGS)

lint: bootstrap
	$(VENV)/bin/ruff check cdc_outbox cdc_outbox_dev tests benchmarks examples
	$(VENV)/bin/mypy --strict cdc_outbox cdc_outbox_dev examples

bench: bootstrap
	$(VENV)/bin/python -m benchmarks relay --events 100000 --txn-size 100 --json benchmarks/out/relay.json
	$(VENV)/bin/python -m benchmarks compare --events 20000 --json benchmarks/out/compare.json
