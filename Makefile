# Targets set up .venv on first use: a CPU torch when none is importable, then
# shardfeed editable, then the extras that target needs: `make demo` and `make
# bench` the bench extra (plots, process trees), `make test` the test extra.
# Each step says what it does and pip shows what it installs (the first run
# downloads torch: the slow step). A torch that is already importable is kept:
# the editable install does not upgrade it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.shardfeed-installed
PIP := $(PY) -m pip install --disable-pip-version-check
TORCH_SPEC ?= torch==2.13.0
# pytest-xdist processes for make test: one per core, at most 4 (many tests start ranks and workers of
# their own, each importing torch); a test module's tests (and its module-scoped fixtures) stay in one
# process. TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)

.PHONY: test test-slow demo bench clean venv kernels

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || { echo "setup: creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@if V=$$($(PY) -c "import torch; print(torch.__version__)" 2>/dev/null); then \
		echo "setup: keeping torch $$V found in $(VENV)"; \
	else \
		echo "setup: installing $(TORCH_SPEC) into $(VENV) (the slow step: a large download)"; \
		$(PIP) "$(TORCH_SPEC)"; \
	fi
	@echo "setup: installing shardfeed (editable) into $(VENV)"
	@$(PIP) -e .
	@echo "setup: compiling shardfeed's kernels once (numba's cache, then a module that loads without numba; about a minute)"
	@$(PY) -m shardfeed.tools.warm
	@touch $(STAMP)
	@echo "setup: $(VENV) is ready"

# An extra's stamp: installed once per set-up (a new pyproject.toml sets up again).
$(VENV)/.extras-%: $(STAMP)
	@echo "setup: installing shardfeed's $* extra into $(VENV)"
	@$(PIP) -e ".[$*]"
	@touch $@

# The compiled kernel module is keyed by the sources of formats/ and shuffling/: after a pull or an
# edit there, warm builds it again (0.2 s when it is current). Without it every process falls back to
# numba's JIT: the demo's data stall went from 9-10% to 14-17% (2026-12-03).
kernels: $(STAMP)
	@$(PY) -m shardfeed.tools.warm

# The suite has two tiers (tests/tiers.py): make test runs the first, under 10 minutes from a clean
# clone on a quiet 2-core machine; make test-slow the second (soaks, fault matrices, peer runs, whole
# training runs of several ranks). .ci/run runs both; a plain pytest runs everything.
test: kernels $(VENV)/.extras-test
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadscope -m "not tier2"

test-slow: kernels $(VENV)/.extras-test
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadscope -m tier2

demo: kernels $(VENV)/.extras-bench
	$(VENV)/bin/shardfeed demo

bench: kernels $(VENV)/.extras-bench
	$(VENV)/bin/shardfeed bench all --out bench-results

clean:
	rm -rf $(VENV) build *.egg-info bench-results
