# The two commands of the README's quick start, on a fresh machine:
#   make suite   the main job: the conformance suite against the reference backend
#   make test    the project's own tests
# and `make demo`, a walkthrough of lowering, errors, archives and the target.
# Both create .venv on first use. TORCH picks the torch build (default: the
# local CPU build of 2.13.0; an unpinned torch would pull CUDA packages).

PYTHON ?= python3
VENV ?= .venv
TORCH ?= 2.13.0
BIN := $(VENV)/bin

.PHONY: suite suite-onnxruntime test demo lint clean

$(VENV)/.installed: pyproject.toml backends/reference/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check torch==$(TORCH)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,models]' -e backends/reference
	touch $@

# From an empty folder, as a vendor would run it: only the suite is collected.
suite: $(VENV)/.installed
	cd "$$(mktemp -d)" && $(abspath $(BIN))/python -m pytest --backend=reference

# The ONNX Runtime backend: a real engine (torch.onnx export + ONNX Runtime CPU).
$(VENV)/.installed-onnxruntime: $(VENV)/.installed backends/onnxruntime/pyproject.toml
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e backends/onnxruntime
	touch $@

# The same suite against that engine, with its known-failures file.
suite-onnxruntime: $(VENV)/.installed-onnxruntime
	cd "$$(mktemp -d)" && $(abspath $(BIN))/python -m pytest --backend=onnxruntime \
	    --backendconf-known-failures=$(abspath backends/onnxruntime/known-failures.toml)

demo: $(VENV)/.installed
	$(BIN)/python examples/reference_walkthrough.py

# ruff (lint; its configuration and that of mypy are in pyproject.toml) and mypy on the package.
lint: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[lint]'
	$(BIN)/ruff check pytest_backendconf conformance backends tests benchmarks examples
	$(BIN)/mypy

test: $(VENV)/.installed-onnxruntime
	$(BIN)/python -m pytest -n 2 tests

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
