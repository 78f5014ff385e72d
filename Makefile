# Two entry points: `make demo` (main job on the built-in example) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean bench-models bench-accuracy zoo fuzz

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m torq.demo

test: $(STAMP)
	$(BIN)/python -m pytest

fuzz: $(STAMP)   # the long mutation-fuzzing run, two seeds (make test runs a few cases)
	for seed in 1000 2000; do \
	  TORQ_FUZZ=$${TORQ_FUZZ:-500} TORQ_FUZZ_SEED=$$seed $(BIN)/python -m pytest -q -s \
	    tests/robustness/test_fuzz.py tests/robustness/test_state_fuzz.py || exit 1; done

bench-models: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/models/build.py

bench-accuracy: bench-models
	$(BIN)/python benchmarks/accuracy.py --json build/accuracy.json

zoo: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[zoo]'
	$(BIN)/python benchmarks/zoo.py --per-layer --json build/zoo.json

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
