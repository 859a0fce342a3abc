# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs every test.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# the tests run in this many processes, whole files each (pytest-xdist): one integration test
# alone keeps the 2 cores a third idle (waits on Spark, sockets, timeouts), which another file
# fills; the unit tests (no JVM, CPU-bound) come last, short files that fill the end.
TEST_WORKERS ?= 2
UNIT_WORKERS ?= 2
LINT_DIRS := $(wildcard src tests examples benchmarks)

.PHONY: demo test unit integration lint typecheck bench clean

$(VENV)/.installed: pyproject.toml scripts/bootstrap.sh
	VENV=$(VENV) ./scripts/bootstrap.sh

demo: $(VENV)/.installed
	$(PY) -m tfonspark.demo $(DEMO_ARGS)

# ends by printing its wall time and the ten slowest tests (tests/timings.py); every test's
# duration goes to build/durations.txt
test: $(VENV)/.installed
	@date +%s > .test-started
	$(PY) -m ruff check $(LINT_DIRS)
	$(PY) -m ruff format --check $(LINT_DIRS)
	$(PY) -m mypy src
	$(PY) -m pytest tests -p tests.timings -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)
	@echo "make test: $$(( $$(date +%s) - $$(cat .test-started) )) s wall time in all (lint, types, tests)"; rm -f .test-started

unit: $(VENV)/.installed
	$(PY) -m pytest tests/unit -p tests.timings -n $(UNIT_WORKERS) --dist loadfile $(PYTEST_ARGS)

integration: $(VENV)/.installed
	$(PY) -m pytest tests/integration tests/acceptance -p tests.timings $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(PY) -m ruff check $(LINT_DIRS)
	$(PY) -m ruff format --check $(LINT_DIRS)

typecheck: $(VENV)/.installed
	$(PY) -m mypy src

bench: $(VENV)/.installed
	$(PY) benchmarks/feed.py
	$(PY) benchmarks/inference.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
