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
# Only the pytest plugins the suite uses. Autoloaded, every installed one came in: the
# test extra's langsmith, schemathesis and anyio bring pytest plugins of their own, and
# each process imported them and rewrote their ~470 modules' asserts, ~5 s of CPU each.
PYTEST_PLUGINS = -p xdist.plugin -p _hypothesis_pytestplugin

.PHONY: run test lint install install-test install-vulkan vulkan-for-tests

# The Vulkan build of llama.cpp beside the CPU one (docs/gpu.md): on a machine with no GPU
# it runs on Mesa's lavapipe. tests/gpu_vulkan/ drives its CLI as a subprocess.
VULKAN_VENV = .venv-vulkan

$(VENV)/.installed: pyproject.toml scripts/install.sh
	./scripts/install.sh
	touch $@

$(VENV)/.installed-test: pyproject.toml scripts/install.sh
	./scripts/install.sh test
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

$(VULKAN_VENV)/.installed: pyproject.toml scripts/install.sh scripts/install_vulkan.sh \
		scripts/patches/ggml-vulkan-headers-1.3.239.patch
	./scripts/install_vulkan.sh test
	touch $@

## Build llama.cpp with its Vulkan backend into .venv-vulkan (lavapipe where no GPU).
install-vulkan: $(VULKAN_VENV)/.installed

## Install, then answer one prompt with the built-in model (Gemma 3 270M).
run: $(VENV)/.installed
	$(VENV)/bin/inferenceos run --prompt "$(PROMPT)" --max-tokens 64

# tests/gpu_vulkan/ drives .venv-vulkan: `make test` builds it first, or installs the cached
# wheel (a minute). Where the build cannot run (no root for apt, no glslc) the group skips
# with its reason in the summary, and the warning here says why.
vulkan-for-tests:
	@$(MAKE) --no-print-directory install-vulkan || echo "warning: make install-vulkan" \
		"failed (above): tests/gpu_vulkan/ will skip"

## Install with the test tools, then run the whole test suite.
# (compileall: the suite starts hundreds of CLI processes; sources edited since the
# install would otherwise be compiled again by each of them, see scripts/install.sh)
test: $(VENV)/.installed-test vulkan-for-tests
	$(VENV)/bin/python -m compileall -q src
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(VENV)/bin/python -m pytest $(PYTEST_PLUGINS) $(if $(filter 1,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

## Static checks: ruff and mypy.
lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy benchmarks
