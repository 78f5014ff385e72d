# Two entry points: `make demo` (main job on the built-in example) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install system-packages clean bench-models bench-accuracy zoo fuzz realworld

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Debian packages some tests read (Fashion-MNIST images, headless Chromium for `view --html`):
# installed when missing, where apt-get is present and we are root (or have password-less sudo);
# tried once per .venv, never fatal. Tests that still lack them skip, and the end of the
# `make test` output lists them with the command that enables them.
SYSTEM_TRIED := $(VENV)/.system-packages-tried
system-packages:
	@missing=""; \
	[ -e /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] || missing="$$missing dataset-fashion-mnist"; \
	command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing="$$missing chromium"; \
	if [ -z "$$missing" ] || [ -e $(SYSTEM_TRIED) ] || ! command -v apt-get >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else \
	  echo "note: not root: sudo apt-get install -y$$missing enables the tests that need them"; exit 0; fi; \
	echo "installing Debian packages:$$missing"; mkdir -p $(VENV); touch $(SYSTEM_TRIED); \
	($$sudo apt-get update -qq && $$sudo apt-get install -y -qq $$missing >/dev/null) \
	  || echo "note: could not install$$missing; the tests that need them will skip"

demo: $(STAMP)
	$(BIN)/python -m torq.demo

test: $(STAMP) system-packages
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

realworld: $(STAMP)   # quantize/verify/discover/run/evaluate on real pretrained models, one table
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/realworld.py --json build/realworld.json

zoo: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[zoo]'
	$(BIN)/python benchmarks/torchvision_zoo.py --per-layer --json build/zoo.json

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
