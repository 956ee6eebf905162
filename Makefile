# Two commands: `make run` (everything on this machine) and `make test` (what CI runs).

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := run

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check

# Tests and benchmarks keep their own database and bundled Redis: a running `make run` is untouched.
TEST_DATA_DIR := $(CURDIR)/var/test
BENCH_DATA_DIR := $(CURDIR)/var/bench

.PHONY: run test bench

## Install, migrate, seed the demo on the first run, and run every process until Ctrl-C.
run: $(VENV)/.installed
	$(PY) manage.py nexus_run

## Lint, check and run the whole test suite.
test: export NEXUS_DATA_DIR := $(TEST_DATA_DIR)
test: $(VENV)/.installed-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) manage.py check
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) manage.py spectacular --validate --fail-on-warn --file /dev/null
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

# A stamp per dependency set: installing is skipped until pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(PY)
	@echo "Installing Nexus into $(VENV)..."
	$(PIP) install --quiet --editable .
	@touch $@

$(VENV)/.installed-dev: pyproject.toml | $(PY)
	@echo "Installing Nexus and its development tools into $(VENV)..."
	$(PIP) install --quiet --editable '.[dev]'
	@touch $@ $(VENV)/.installed
