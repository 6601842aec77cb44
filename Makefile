# tfopt: `make run` sets everything up and runs the demo; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test lint up down status clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/tfopt up
	$(BIN)/tfopt demo-data
	$(BIN)/tfopt run --config configs/demo.yaml --summary-json .tfopt/demo-summary.json

test: install
	$(BIN)/ruff check .
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check .

up: install
	$(BIN)/tfopt up

down:
	test ! -x $(BIN)/tfopt || $(BIN)/tfopt down

status: install
	$(BIN)/tfopt status

clean: down
	rm -rf .tfopt data/demo
