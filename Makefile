# Quick start: `make demo`, then `make test`.
# `make demo` installs trainyard with its `train` extra only (torch's CPU build); `make test`
# and `make install` add what the tests need (the `dev`, `test-s3` and `test-web` extras).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test

.PHONY: demo test check format install clean bench

$(DEMO_STAMP): pyproject.toml scripts/install.sh requirements/demo.lock
	@PYTHON=$(PYTHON) bash scripts/install.sh demo
	@touch $(DEMO_STAMP)

$(TEST_STAMP): $(DEMO_STAMP)
	@PYTHON=$(PYTHON) bash scripts/install.sh test
	@touch $(TEST_STAMP)

install: $(TEST_STAMP)

demo: $(DEMO_STAMP)
	@bash scripts/demo.sh

# check: the formatter's verdict (no file is changed), the linter, the type checker (settings
# in pyproject.toml: [tool.ruff], [tool.mypy]). `make test` runs it first, so CI does too.
check: $(TEST_STAMP)
	$(VENV)/bin/ruff format --check
	$(VENV)/bin/ruff check
	$(VENV)/bin/mypy src/trainyard

# format: sort the imports and format every file as `make check` wants them.
format: $(TEST_STAMP)
	$(VENV)/bin/ruff check --select I --fix
	$(VENV)/bin/ruff format

test: check
	$(PY) -m pytest -q

bench: $(TEST_STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build src/*.egg-info
