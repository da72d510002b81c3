# Entry points; each first runs scripts/bootstrap.sh (idempotent, fast once set up).
#   make demo   - the end-to-end demo on local PostgreSQL + Kafka
#   make test   - the full test suite (real PostgreSQL and Kafka, no Docker)
#   make lint   - ruff + mypy --strict
VENV := .venv
PYTEST_ARGS ?=

.PHONY: bootstrap demo test lint

bootstrap:
	scripts/bootstrap.sh

demo: bootstrap
	$(VENV)/bin/cdc-outbox demo

test: bootstrap
	$(VENV)/bin/pytest -p no:cacheprovider -q $(PYTEST_ARGS)

lint: bootstrap
	$(VENV)/bin/ruff check cdc_outbox tests
	$(VENV)/bin/mypy --strict cdc_outbox
