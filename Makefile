# Quick start: `make demo`, then `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install clean bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[train,dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	bash scripts/demo.sh

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build src/*.egg-info
