# make run   : set up .venv and run the default study (python experiments/sweep.py -m) on the embedded store
# make test  : set up .venv (+ dev tools, Chromium for the UI test) and run the test suite
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# torch first, pinned to the local CPU wheel: anything that resolves torch later finds it satisfied
TORCH   := torch==2.13.0

# Installs happen once: a stamp file in the venv, redone only when pyproject.toml changes.
STAMP   := $(VENV)/.installed
.PHONY: setup setup-dev run test test-fast ui report lint

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e .
	@touch $@

setup: $(STAMP)

setup-dev: $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[dev]"
	@command -v chromium >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
		echo "chromium not installed: the UI test will fail (apt-get install chromium)"; }

run: $(STAMP)
	$(BIN)/python experiments/sweep.py -m

test: setup-dev
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

test-fast: setup-dev
	$(BIN)/python -m pytest -m "not slow"

ui:
	$(BIN)/python -m stability.tracking.server --store sqlite:///$(CURDIR)/mlflow.db --port 5000

report: $(STAMP)
	$(BIN)/python experiments/report.py

lint: setup-dev
	$(BIN)/ruff check .
