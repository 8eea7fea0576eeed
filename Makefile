# Front door: `make demo` and `make test` each do their own set-up on a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; override with TORCH_SPEC="torch" to take your own.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo test lint bench mutants gpu-check screenshots

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	@# .[test] is everything: the dashboard extra, then the test tools
	$(BIN)/pip install -q -e ".[test]"
	@# memprof's native allocator reporter (about 10 s with g++); without it memprof falls back to torch.profiler
	-$(BIN)/python -c "import sys; from memprof.capture.native.build import main; sys.exit(main())"
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/memprof demo $(ARGS)

lint: setup
	$(BIN)/ruff check memprof planner dashboard cli examples tests benchmarks scripts
	$(BIN)/mypy

test: setup
	bash scripts/install_browser.sh
	$(BIN)/ruff check memprof planner dashboard cli examples tests benchmarks scripts
	$(BIN)/mypy
	@# the quick suite on every core (pytest-xdist), then the tests marked slow, which plain `pytest` leaves out
	$(BIN)/python -m pytest -q -n auto --durations=25 $(ARGS)
	$(BIN)/python -m pytest -q -n auto -m slow --durations=10 $(ARGS)
	@# deliberate breakages the tests must catch (scripts/mutants.py; a few minutes)
	$(BIN)/python scripts/mutants.py

# The mutation check alone: each breakage of scripts/mutants.py applied to a copy of the tree, its tests run.
mutants: setup
	$(BIN)/python scripts/mutants.py $(ARGS)

bench: setup
	$(BIN)/python -m benchmarks $(ARGS)

# Every GPU test and benchmarks/bench_gpu.py on this machine's CUDA device, written to docs/gpu.md (docs/gpu.md says
# how). No set-up step: it finds a Python with a CUDA torch itself; without CUDA it says so in one line, exit 0.
gpu-check:
	@$(PY) scripts/gpu_check.py --torch-spec "$(TORCH_SPEC)" $(ARGS)

# Every dashboard tab at 1600x1000 into docs/images/ (docs/dashboard.md shows them); the demo's runs are made
# first in build/screenshot-traces when that folder is empty (a few minutes).
screenshots: setup
	bash scripts/install_browser.sh
	$(BIN)/python scripts/screenshots.py $(ARGS)
