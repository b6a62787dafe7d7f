# Both targets set up .venv on first use: a CPU torch when none is importable,
# then shardfeed editable with its test extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.shardfeed-installed
TORCH_SPEC ?= torch==2.13.0

.PHONY: test demo bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --disable-pip-version-check -q "$(TORCH_SPEC)"
	$(PY) -m pip install --disable-pip-version-check -q -e ".[test]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -ra

demo: $(STAMP)
	$(VENV)/bin/shardfeed demo

bench: $(STAMP)
	$(VENV)/bin/shardfeed bench all --out bench-results

clean:
	rm -rf $(VENV) build *.egg-info bench-results
