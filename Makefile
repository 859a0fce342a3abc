# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs every test.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# the unit tests run in this many processes; the integration tests in one after them: side by
# side (pytest tests -n 2) the suite ran 0.77-0.95x as long, but test_restart_feed's timing
# failed once in four runs (its two nodes must read at one speed)
UNIT_WORKERS ?= 2
LINT_DIRS := $(wildcard src tests examples benchmarks)

.PHONY: demo test unit integration lint typecheck bench clean

$(VENV)/.installed: pyproject.toml scripts/bootstrap.sh
	VENV=$(VENV) ./scripts/bootstrap.sh

demo: $(VENV)/.installed
	$(PY) -m tfonspark.demo $(DEMO_ARGS)

test: $(VENV)/.installed
	$(PY) -m ruff check $(LINT_DIRS)
	$(PY) -m ruff format --check $(LINT_DIRS)
	$(PY) -m mypy src
	$(PY) -m pytest tests/unit -n $(UNIT_WORKERS) --dist loadfile $(PYTEST_ARGS)
	$(PY) -m pytest tests/integration tests/acceptance $(PYTEST_ARGS)

unit: $(VENV)/.installed
	$(PY) -m pytest tests/unit -n $(UNIT_WORKERS) --dist loadfile $(PYTEST_ARGS)

integration: $(VENV)/.installed
	$(PY) -m pytest tests/integration tests/acceptance $(PYTEST_ARGS)

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
