# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The tests always use the real servers on loopback (trust auth).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/governance
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
# Test processes (pytest-xdist), each with its own test database and Redis
# database (tests/worker_isolation.py); a test file stays in one process.
# PYTEST_WORKERS= runs the suite in one process.
PYTEST_WORKERS ?= -n 2 --dist loadfile

.PHONY: run test lint format install services

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/.installed

# Web + worker + scheduler on the embedded defaults (SQLite, file-system broker):
# make run PORT=8001 HOST=0.0.0.0, make run VERBOSE=1 for the full logs.
HOST ?= 127.0.0.1
PORT ?= 8000
run: install
	$(BIN)/python manage.py up --host $(HOST) --port $(PORT)$(if $(VERBOSE), --verbose)

services:
	bash .ci/services.sh

test: install services
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .
