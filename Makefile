# Entry points; each first runs scripts/bootstrap.sh (idempotent, fast once set up).
#   make demo   - the end-to-end demo on local PostgreSQL + Kafka
#   make test   - the full test suite (real PostgreSQL and Kafka, no Docker)
#   make unit   - the unit tests only (pure cores and fakes, no servers; under a minute)
#   make test-versions - the relay, fault and failover tests (VERSION_TESTS) on each of
#                 PG_VERSIONS (CDC_OUTBOX_PG_VERSION; all run, non-zero exit if any failed)
#   make lint   - ruff + mypy --strict + lint-imports (the layer contracts in pyproject.toml)
#                 + scripts/import_cycles.py (no import cycle, function-level imports counted)
#   make bench  - the relay (vs raw slot drain) and compare (CDC vs polling) benchmarks, JSON in
#                 benchmarks/out; `python -m benchmarks --help` lists every benchmark
VENV := .venv
PYTEST_ARGS ?=
PG_VERSIONS ?= 16 17 18
# The one list of tests CI runs on every PostgreSQL major besides the full suite's (15). The
# relay's memory on a huge transaction (about a minute) is left to the full suite: it measures
# the relay process, not the server.
VERSION_TESTS := \
	tests/integration/test_relay_delivery.py \
	tests/integration/test_relay_faults.py \
	tests/integration/test_standby_harness.py \
	tests/integration/test_failover.py \
	tests/integration/test_slot_invalidation.py \
	tests/integration/test_failover_slots.py \
	--deselect tests/integration/test_relay_faults.py::test_memory_stays_bounded_on_a_huge_transaction

.PHONY: bootstrap demo test unit test-versions lint bench

bootstrap:
	scripts/bootstrap.sh

demo: bootstrap
	$(VENV)/bin/cdc-outbox demo

test: bootstrap
	$(VENV)/bin/pytest -p no:cacheprovider -q $(PYTEST_ARGS)

unit: bootstrap
	$(VENV)/bin/pytest -p no:cacheprovider -q tests/unit $(PYTEST_ARGS)

test-versions: bootstrap
	@status=0; for v in $(PG_VERSIONS); do \
	  echo "== PostgreSQL $$v: $(VERSION_TESTS)"; \
	  CDC_OUTBOX_PG_VERSION=$$v $(VENV)/bin/pytest -p no:cacheprovider -q $(PYTEST_ARGS) \
	    $(VERSION_TESTS) || status=1; \
	done; exit $$status

lint: bootstrap
	$(VENV)/bin/ruff check cdc_outbox cdc_outbox_dev tests benchmarks examples setup.py
	$(VENV)/bin/mypy --strict cdc_outbox cdc_outbox_dev examples benchmarks
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python scripts/import_cycles.py

bench: bootstrap
	$(VENV)/bin/python -m benchmarks relay --events 300000 --txn-size 100 --rounds 4
	$(VENV)/bin/python -m benchmarks compare --events 300000 --eos-events 300000 --mark-events 300000 --latency-rounds 3
