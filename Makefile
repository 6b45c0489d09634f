# hydra-ens: the two commands of the quick start are `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120

.PHONY: install browser run test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || (echo "error: Python 3.11+ is required (python3.11 or python3 on PATH)" >&2; exit 1)
	$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "error: Python >= 3.11 required, found " + sys.version.split()[0])'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## Install everything and run the main job (the default pipeline on the embedded default data).
run: install
	$(BIN)/hydra-ens run

## Chromium from Debian's packages, for the tests that open the run report in a headless browser
## (they skip, saying why, where it cannot be installed: no root or no apt-get).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
	    >/dev/null; } || echo "note: chromium is not installed; the browser tests will skip"

## Install everything and run the whole test suite (lint included).
test: install browser
	$(BIN)/ruff check .
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
