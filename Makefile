# Two entry points for a fresh machine (see README): `make run` and `make test`.
VENV ?= .venv
PROMPT ?= The three primary colors are
PYTEST_ARGS ?=
# Test files run in four processes (pytest-xdist, a file per process at a time: a file's
# shared fixtures are built once), each pinned to its share of the CPUs (two per CPU on
# the 2-core machines this is sized for; tests/conftest.py), so llama.cpp computes on one
# thread per process and the other process on the CPU fills its waits; 1 runs serially.
# The files go out longest first (tests/conftest.py, tests/file_durations.json).
TEST_JOBS ?= 4

.PHONY: run test lint install install-test

$(VENV)/.installed: pyproject.toml scripts/install.sh
	./scripts/install.sh
	touch $@

$(VENV)/.installed-test: pyproject.toml scripts/install.sh
	./scripts/install.sh test
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

## Install, then answer one prompt with the built-in model (Gemma 3 270M).
run: $(VENV)/.installed
	$(VENV)/bin/inferenceos run --prompt "$(PROMPT)" --max-tokens 64

## Install with the test tools, then run the whole test suite.
# (compileall: the suite starts hundreds of CLI processes; sources edited since the
# install would otherwise be compiled again by each of them, see scripts/install.sh)
test: $(VENV)/.installed-test
	$(VENV)/bin/python -m compileall -q src
	$(VENV)/bin/python -m pytest $(if $(filter 1,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

## Static checks: ruff and mypy.
lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy benchmarks
