# attn-mt: `make demo` sets up and runs the main job; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
# offline; and Python's bytecode cache even where the environment turns it off: every command a test starts
# would compile attn_mt anew, and pytest would rewrite every test module's asserts in each worker
TEST_ENV := HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 PYTHONDONTWRITEBYTECODE=

.PHONY: setup test test-fast demo clean-demo lint smoke clean

$(BIN)/attn-mt: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU build of torch first where there is no NVIDIA GPU (a bare `torch` pulls a multi-GB CUDA build)
	if command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install -q "torch>=2.4,<3"; \
	else $(BIN)/pip install -q $(TORCH) || $(BIN)/pip install -q $(TORCH) --index-url https://download.pytorch.org/whl/cpu; fi
	$(BIN)/pip install -q -e ".[dev,all]"
	touch $@

setup: $(BIN)/attn-mt  ## create .venv and install attn-mt with its dependencies

test: setup  ## run the whole test suite, slow tests included (CPU, a few minutes; a plain pytest skips the slow ones)
	$(TEST_ENV) $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not network"

test-fast: setup  ## the tests not marked slow: no real training runs or started commands (about a minute)
	$(TEST_ENV) $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow and not network"

DEMO := runs/toy
demo: setup  ## train the built-in toy config once (later runs reuse it), translate three sentences
	@if [ -f $(DEMO)/results.json ] && [ $(DEMO)/results.json -nt configs/toy.yaml ]; then \
	  echo "$(DEMO): reusing the finished toy run (make clean-demo trains it afresh)"; \
	  $(BIN)/python -c "from attn_mt.training.progress import summary; print(summary('$(DEMO)'))"; \
	else \
	  echo "$(DEMO): training the toy config afresh (6 epochs, 330 steps, 1 thread)"; \
	  $(BIN)/attn-mt train --config configs/toy.yaml --out $(DEMO) --overwrite || exit $$?; \
	fi
	printf '%s\n' "the old man sees a small dog." "yesterday the children find the red ball." \
	  "a woman thinks that the teachers like the quiet horses." | \
	  $(BIN)/attn-mt translate --checkpoint $(DEMO)/checkpoint_best.pt

clean-demo:  ## delete the demo's run (runs/toy), so the next `make demo` trains afresh
	rm -rf $(DEMO)

lint: setup  ## ruff check (the code is wrapped by hand at 100 columns; no ruff format)
	$(BIN)/ruff check attn_mt tests scripts

smoke: setup  ## a few hundred steps of the toy config
	$(BIN)/attn-mt train --config configs/toy.yaml --out runs/smoke --set train.max_steps=200

clean:  ## delete every run under runs/ and the tools' caches
	rm -rf runs .pytest_cache .ruff_cache
