# make run   : set up .venv and run the default study (python experiments/sweep.py -m) on the embedded store
# make test  : set up .venv (+ dev tools and the lightning/hf extras; as root the Debian packages of the server, SLURM and
#              UI tests) and run the test suite (the 20 slowest tests listed at the end)
# make benchmark : overhead, memory, precision, accumulation (docs/performance.md; ~3 min)
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# torch first, pinned to the local CPU wheel: anything that resolves torch later finds it satisfied
TORCH   := torch==2.13.0
# PostgreSQL + MLflow auth, SLURM with accounting (slurmdbd on MariaDB), munge, the UI browser
DEB_PACKAGES := postgresql slurm-wlm slurmdbd munge mariadb-server chromium

# Installs happen once: a stamp file in the venv, redone only when pyproject.toml changes.
STAMP   := $(VENV)/.installed
UV      := $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python
.PHONY: setup setup-dev run test test-fast ui report lint benchmark

# pip installs torch alone (it reads the machine's pip settings, which point at the local
# wheel); uv installs the rest in parallel (~25 s where pip took ~2 min) and finds torch
# satisfied. Both compile bytecode at install: where PYTHONDONTWRITEBYTECODE is set, no process
# would ever write it, and each would compile what it imports again.
$(BIN)/python:
	$(PY) -m venv $(VENV)

$(BIN)/uv: | $(BIN)/python
	$(BIN)/pip install -q $(TORCH) uv

$(STAMP): pyproject.toml | $(BIN)/uv
	$(UV) -e .
	@touch $@

setup: $(STAMP)

setup-dev: $(BIN)/uv
	$(UV) -e ".[dev,lightning,hf]"  # the integrations' tests need both
	@# the native team stack and SLURM tests (tests/test_team_stack.py, tracking/test_auth.py, sweep/test_slurm.py)
	@# and the UI test need these Debian packages; installed only as root and only when missing
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
		else echo "missing Debian packages:$$missing (the server/SLURM/UI tests will fail)"; fi; fi

run: $(STAMP)
	$(BIN)/python experiments/sweep.py -m

# The suite's temp folders (SQLite stores, journals, checkpoints, PostgreSQL and SLURM state) on
# tmpfs where the machine has one: each commit's fsync waits on the disk otherwise
# (docs/performance.md, "The suite's temp folders").
TEST_TMP := $(shell [ -d /dev/shm ] && [ -w /dev/shm ] && echo /dev/shm/stability-tests)
PYTEST   := $(if $(TEST_TMP),mkdir -p $(TEST_TMP) && TMPDIR=$(TEST_TMP)) $(BIN)/python -m pytest

test: setup-dev
	$(BIN)/ruff check .
	$(PYTEST) -n auto --dist loadgroup --durations=20

test-fast: setup-dev
	$(PYTEST) -n auto --dist loadgroup -m "not slow" --durations=20

benchmark: $(STAMP)
	$(BIN)/python experiments/benchmark.py

ui:
	$(BIN)/python -m stability.tracking.server --store sqlite:///$(CURDIR)/mlflow.db --port 5000

report: $(STAMP)
	$(BIN)/python experiments/report.py

lint: setup-dev
	$(BIN)/ruff check .
	$(BIN)/lint-imports  # the layers in pyproject's [tool.importlinter]
