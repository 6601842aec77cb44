# tfopt: `make run` sets everything up (servers, a worker, the deployments) and runs the demo;
# `make test` sets up and runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

CHROMIUM ?= /usr/bin/chromium

.PHONY: install browser-deps db-deps run test test-slow lint up down status serve clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile -e '.[dev]'
	@# pip byte-compiles on one core, compileall on all: the same files (measured 115 s -> 104 s).
	@# Only a speed-up: a file written for a newer Python (whenever's _typing_312.py) cannot
	@# compile here, is never imported here, and must not fail the install.
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1 || true
	touch $(STAMP)

install: $(STAMP)

# Debian's Chromium for the browser tests (Playwright drives it; no browser download).
browser-deps:
	@test -x $(CHROMIUM) || { \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }
	@$(CHROMIUM) --version 2>/dev/null

# Debian's PostgreSQL for `tfopt up --db postgres` and the tests on it (tfopt runs the server from
# a data folder under .tfopt, not as the system service).
db-deps:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql >/dev/null; }
	@ls /usr/lib/postgresql/*/bin/postgres 2>/dev/null || command -v postgres

run: install
	$(BIN)/tfopt up
	$(BIN)/tfopt demo-data
	$(BIN)/tfopt deploy
	$(BIN)/tfopt run --config configs/demo.yaml --summary-json .tfopt/demo-summary.json

test: install browser-deps db-deps
	$(BIN)/ruff check .
	$(BIN)/pytest

# The checks too heavy for every change (many full runs, server outages, multi-worker training,
# the UI form's run, slowdowns confirmed side by side): before landing a change that touches them.
test-slow: install browser-deps db-deps
	$(BIN)/pytest -m slow

lint: install
	$(BIN)/ruff check .

up: install
	$(BIN)/tfopt up

down:
	test ! -x $(BIN)/tfopt || $(BIN)/tfopt down

status: install
	$(BIN)/tfopt status

serve: install
	$(BIN)/tfopt up --no-worker
	$(BIN)/tfopt demo-data
	$(BIN)/tfopt serve

clean: down
	rm -rf .tfopt data/demo data/digits-hard
