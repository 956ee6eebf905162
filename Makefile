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
TEST_DATA_DIR := $(CURDIR)/var/test
BENCH_DATA_DIR := $(CURDIR)/var/bench

.PHONY: run check test bench lock

## Install, migrate, seed the demo on the first run, and run every process until Ctrl-C.
run: $(VENV)/.installed
	$(PY) manage.py nexus_run

## Lint, type-check, and check Django's configuration, migrations and API schema: no tests.
check: export NEXUS_DATA_DIR := $(TEST_DATA_DIR)
check: $(VENV)/.installed-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) manage.py check
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) manage.py spectacular --validate --fail-on-warn --file /dev/null

## `make check`, then the whole test suite.
test: export NEXUS_DATA_DIR := $(TEST_DATA_DIR)
test: check
	$(PY) -m pytest

## Measure the gateway's and the agent's overhead, the simulator, the balancer (decisions, quality).
bench: export NEXUS_DATA_DIR := $(BENCH_DATA_DIR)
bench: $(VENV)/.installed-dev
	$(PY) bench/gateway_overhead.py
	$(PY) bench/agent_overhead.py
	$(PY) bench/simulator_throughput.py
	$(PY) bench/balancer_decision.py
	$(PY) bench/balancing_quality.py

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
