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

.PHONY: target-venv torchscript-built replay-aarch64 suite suite-llm release-torch suite-releases suite-onnxruntime suite-executorch suite-openvino suite-iree suite-torchscript test test-slow demo lint clean

$(VENV)/.installed: pyproject.toml backends/reference/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check torch==$(TORCH)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,models,quant]' -e backends/reference
	touch $@

# From an empty folder, as a vendor would run it: only the suite is collected.
suite: $(VENV)/.installed
	cd "$$(mktemp -d)" && $(abspath $(BIN))/python -m pytest --backend=reference

# The ONNX Runtime backend: a real engine (torch.onnx export + ONNX Runtime CPU).
$(VENV)/.installed-onnxruntime: $(VENV)/.installed backends/onnxruntime/pyproject.toml
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e backends/onnxruntime
	touch $@

# The same suite against that engine, with its known-failures file, the whole
# default ops matrix (1,624 checks) included: the engines declare
# Capabilities(batch_ops=True), so their ops checks share lowerings (a real
# lowering costs a second or more however small the program). ENGINE_OPS=quick
# runs the quick selection (404 checks); SUITE_ARGS=--backendconf-batch=off one
# lowering per check.
ENGINE_OPS ?= default
suite-onnxruntime: $(VENV)/.installed-onnxruntime
	cd "$$(mktemp -d)" && $(abspath $(BIN))/python -m pytest --backend=onnxruntime -n 2 \
	    --backendconf-ops=$(ENGINE_OPS) \
	    --backendconf-known-failures=$(abspath backends/onnxruntime/known-failures.toml) $(SUITE_ARGS)

# The ExecuTorch backend (XNNPACK delegate, portable kernels), as a user installs
# it: executorch with --no-deps (its requirements pull coremltools,
# scikit-learn, hydra... that lowering does not need), then the few packages
# lowering and the runtime do need. A missing flatbuffers shows up as a
# misleading "prebuilt extension ... _C is not found". executorch 1.5.1 is
# built against torch 2.13 (its extension links libtorch); the recipe must
# never change torch, so the last step checks that it did not.
EXECUTORCH_PINS ?= executorch==1.5.1 torchao==0.18.0
EXECUTORCH_DEPS ?= numpy ruamel.yaml flatbuffers tabulate packaging pyyaml
$(VENV)/.installed-executorch: $(VENV)/.installed backends/executorch/pyproject.toml
	$(BIN)/python -c 'import torch; print(torch.__version__)' > $(VENV)/.torch-before-executorch
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps $(EXECUTORCH_PINS)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(EXECUTORCH_DEPS)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e backends/executorch
	@before="$$(cat $(VENV)/.torch-before-executorch)"; \
	after="$$($(BIN)/python -c 'import torch; print(torch.__version__)')"; \
	if [ "$$before" != "$$after" ]; then \
	    echo "installing ExecuTorch changed torch from $$before to $$after; reinstall torch==$(TORCH)" >&2; exit 1; \
	fi
	touch $@

# The [llm] extra (transformers, for the stateful category's real model): its requirements name no torch;
# the last step checks that installing it did not change torch all the same.
$(VENV)/.installed-llm: $(VENV)/.installed pyproject.toml
	$(BIN)/python -c 'import torch; print(torch.__version__)' > $(VENV)/.torch-before-llm
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[llm]'
	@before="$$(cat $(VENV)/.torch-before-llm)"; \
	after="$$($(BIN)/python -c 'import torch; print(torch.__version__)')"; \
	if [ "$$before" != "$$after" ]; then \
	    echo "installing transformers changed torch from $$before to $$after; reinstall torch==$(TORCH)" >&2; exit 1; \
	fi
	touch $@

# The stateful category on the real LLM (transformers' tiny Llama) against the reference backend.
suite-llm: $(VENV)/.installed-llm
	cd "$$(mktemp -d)" && $(abspath $(BIN))/python -m pytest --backend=reference -m stateful \
	    --backendconf-zoo=real $(SUITE_ARGS)

# The suite against ExecuTorch, two workers, each model's checks on one worker
# (the suite's xdist grouping), so each worker lowers its own models, once each.
# The Hypothesis profile is pinned to the derandomized `ci` profile, here and
# on CI alike: a few low-precision checks (bfloat16 convolutions, float16
# exp/log) miss the declared tolerance for some drawn inputs and not others
# (known-failures.toml), and a strict gate needs the same inputs every run.
# EXECUTORCH_HYPOTHESIS=dev draws afresh (expect those entries to flip).
# SUITE_ARGS adds options, e.g. SUITE_ARGS=--backendconf-report=$$PWD/executorch.json
# The timeout is 300 s, not the default 120: lowering the prefill/decode decoder through ExecuTorch
# took 70 to 95 s on a loaded 2-core machine, and once 120 s.
EXECUTORCH_HYPOTHESIS ?= ci
suite-executorch: $(VENV)/.installed-executorch
	cd "$$(mktemp -d)" && $(abspath $(BIN))/python -m pytest --backend=executorch -n 2 \
	    --backendconf-hypothesis=$(EXECUTORCH_HYPOTHESIS) --backendconf-ops=$(ENGINE_OPS) --backendconf-timeout=300 \
	    --backendconf-known-failures=$(abspath backends/executorch/known-failures.toml) $(SUITE_ARGS)

# The TorchScript reference backend: C++ against TorchScript's delegate API,
# built with torch.utils.cpp_extension (g++ and ninja) into a cache folder
# ($$BACKENDCONF_TORCHSCRIPT_CACHE, default ~/.cache/backendconf/torchscript,
# one folder per torch version and source hash). Built here, before any test
# runs, with the broken variants the tests use: a clean build (about a
# minute for both) never counts against `make test`; later builds are found
# in the cache at once.
TORCHSCRIPT_SOURCE := backends/torchscript_reference/backendconf_torchscript_reference/csrc/reference_backend.cpp
$(VENV)/.installed-torchscript: $(VENV)/.installed backends/torchscript_reference/pyproject.toml $(TORCHSCRIPT_SOURCE)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e backends/torchscript_reference
	$(BIN)/python -m backendconf_torchscript_reference
	touch $@

# The library itself, before anything loads it: the cache may have been emptied since the stamp
# (found at once when it was not).
torchscript-built: $(VENV)/.installed-torchscript
	$(BIN)/python -m backendconf_torchscript_reference >/dev/null

# The suite's TorchScript form against that backend (torch._C._jit_to_backend, the lite interpreter).
suite-torchscript: torchscript-built
	cd "$$(mktemp -d)" && $(abspath $(BIN))/python -m pytest --backend=torchscript_reference $(SUITE_ARGS)

# The OpenVINO backend (its PyTorch frontend, the IR on the CPU plugin).
# openvino's PyTorch frontend imports `packaging`, which the wheel does not
# declare. Neither package names torch; the last step checks that torch did
# not change all the same.
OPENVINO_PINS ?= openvino==2026.4.1 packaging
$(VENV)/.installed-openvino: $(VENV)/.installed backends/openvino/pyproject.toml
	$(BIN)/python -c 'import torch; print(torch.__version__)' > $(VENV)/.torch-before-openvino
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(OPENVINO_PINS)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e backends/openvino
	@before="$$(cat $(VENV)/.torch-before-openvino)"; \
	after="$$($(BIN)/python -c 'import torch; print(torch.__version__)')"; \
	if [ "$$before" != "$$after" ]; then \
	    echo "installing OpenVINO changed torch from $$before to $$after; reinstall torch==$(TORCH)" >&2; exit 1; \
	fi
	touch $@

# The suite against OpenVINO: two workers, each model's checks on one worker,
# the derandomized `ci` Hypothesis profile (a strict known-failures file needs
# the same inputs every run; OPENVINO_HYPOTHESIS=dev draws afresh).
# The ops category runs the default matrix (ENGINE_OPS=quick for the quick
# selection, as for the other engines), batched: the backend declares Capabilities(batch_ops=True). The
# known-failures file lists every failing check of that matrix; with the
# quick selection its entries for other checks match nothing and only warn.
OPENVINO_HYPOTHESIS ?= ci
suite-openvino: $(VENV)/.installed-openvino
	cd "$$(mktemp -d)" && $(abspath $(BIN))/python -m pytest --backend=openvino -n 2 \
	    --backendconf-hypothesis=$(OPENVINO_HYPOTHESIS) --backendconf-ops=$(ENGINE_OPS) \
	    --backendconf-known-failures=$(abspath backends/openvino/known-failures.toml) $(SUITE_ARGS)

# The IREE backend (iree-compile for llvm-cpu on the generic x86-64 CPU, IREE's
# runtime on the local-sync driver). Neither wheel names torch (the compiler
# needs numpy and sympy, the runtime numpy and ml_dtypes); the last step checks
# that torch did not change all the same.
IREE_PINS ?= iree-base-compiler==3.13.0 iree-base-runtime==3.13.0
$(VENV)/.installed-iree: $(VENV)/.installed backends/iree/pyproject.toml
	$(BIN)/python -c 'import torch; print(torch.__version__)' > $(VENV)/.torch-before-iree
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(IREE_PINS) ml_dtypes
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e backends/iree
	@before="$$(cat $(VENV)/.torch-before-iree)"; \
	after="$$($(BIN)/python -c 'import torch; print(torch.__version__)')"; \
	if [ "$$before" != "$$after" ]; then \
	    echo "installing IREE changed torch from $$before to $$after; reinstall torch==$(TORCH)" >&2; exit 1; \
	fi
	touch $@

# The suite against IREE: two workers, the derandomized `ci` Hypothesis profile
# (a strict known-failures file needs the same inputs every run;
# IREE_HYPOTHESIS=dev draws afresh), the ops category's default matrix, batched
# (the backend declares Capabilities(batch_ops=True); ENGINE_OPS=quick for the
# quick selection, whose entries for other checks then only warn).
IREE_HYPOTHESIS ?= ci
# The timeout is 300 s, not the default 120: the stateful decoders' partitioned lowering builds each
# node alone with iree-compile (llama_decoder 69 s with nothing else running), and beside two other
# suites it took over 120 s.
suite-iree: $(VENV)/.installed-iree
	cd "$$(mktemp -d)" && $(abspath $(BIN))/python -m pytest --backend=iree -n 2 \
	    --backendconf-hypothesis=$(IREE_HYPOTHESIS) --backendconf-ops=$(ENGINE_OPS) --backendconf-timeout=300 \
	    --backendconf-known-failures=$(abspath backends/iree/known-failures.toml) $(SUITE_ARGS)

# The suite against the reference backend under older torch releases, each in its own environment
# outside the repository (PyPI's builds, as a vendor installs them: `pip install torch==X`, the
# project with its [test] extra, which never moves torch, triton removed as tox.ini does).
# `make suite-releases` runs the oldest supported release and one in the middle; `make suite`
# is the third (2.13.0). Each environment is made once and kept (4 to 6 GB each).
RELEASES ?= 2.10.0 2.12.1
RELEASE_ENVS ?= $(HOME)/.cache/backendconf/torch-envs
# `make release-torch` makes the environments and installs torch alone (minutes of download, no
# file of the checkout touched), so that .ci/run can start it early beside the CPU-bound steps.
release-torch:
	@for release in $(RELEASES); do \
	    env="$(RELEASE_ENVS)/$$release"; \
	    if ! "$$env/bin/python" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$$release')" 2>/dev/null; then \
	        rm -rf "$$env" && $(PYTHON) -m venv "$$env" && \
	        "$$env/bin/python" -m pip install --quiet --disable-pip-version-check torch==$$release || exit 1; \
	    fi; \
	done

suite-releases: release-torch
	@for release in $(RELEASES); do \
	    env="$(RELEASE_ENVS)/$$release"; \
	    "$$env/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[test]' -e backends/reference || exit 1; \
	    "$$env/bin/python" -m pip uninstall --yes --quiet triton 2>/dev/null; \
	    "$$env/bin/python" -c "import sys, torch; sys.exit(0 if torch.__version__.split('+')[0] == '$$release' else 'installing the project moved torch to ' + torch.__version__)" || exit 1; \
	    echo "== the suite under torch $$release"; \
	    (cd "$$(mktemp -d)" && "$$env/bin/python" -m pytest --backend=reference -n 2 -q --backendconf-hypothesis=ci) || exit 1; \
	done

demo: $(VENV)/.installed
	$(BIN)/python examples/reference_walkthrough.py

# ruff (lint and format check; its configuration and that of mypy are in pyproject.toml) and mypy on the package and the suite.
LINTED := pytest_backendconf conformance backends tests benchmarks examples
# The linters install once (a stamp, like the engines): `make lint` itself only reads the checkout, so
# .ci/run can run it beside the suite.
$(VENV)/.installed-lint: $(VENV)/.installed pyproject.toml
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[lint]'
	touch $@

# mypy reads the suite under its installed name through a link (pyproject.toml's [tool.mypy] says why).
lint: $(VENV)/.installed-lint
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	mkdir -p build/mypy/pytest_backendconf && ln -sfn ../../../conformance build/mypy/pytest_backendconf/conformance
	$(BIN)/mypy

# The tests of seconds: under 5 minutes on 2 cores. What runs whole pytest sessions, fresh
# processes or timeouts for several seconds is marked slow and runs in `make test-slow` (CI runs both).
test: $(VENV)/.installed-onnxruntime torchscript-built
	$(BIN)/python -m pytest -n 2 tests -m "not slow"

# The end-to-end tests (`@pytest.mark.slow`): whole suite runs against the broken backends, hangs and
# crashes in the backend host, the devices, the proofs that take minutes (the eager backend through the
# whole default suite).
# The ssh device of tests/test_device_ssh.py (docs/vendor-ci.md): a venv outside /tmp and the checkout
# with torch, the reference backend and this checkout installed with --no-deps (no pytest, no Hypothesis).
# Re-installs the project when its sources changed (the tests skip, naming this target, when stale).
TARGET_VENV ?= $(HOME)/.cache/backendconf/target-venv
target-venv:
	TORCH=$(TORCH) devices/ssh-device.sh venv $(TARGET_VENV) >/dev/null
	$(BIN)/python -c 'from tests.device_source import source_hash; print(source_hash())' > $(TARGET_VENV)/source-hash

# The golden replay on the emulated aarch64 device (devices/aarch64-device.sh builds it once into
# ~/.cache/backendconf/aarch64-device): a golden folder written here (x86, this torch) replayed there
# (aarch64, torch 2.10.0). Its time is in docs/vendor-ci.md; not in .ci/run.
AARCH64_ROOT ?= $(HOME)/.cache/backendconf/aarch64-device
replay-aarch64: $(VENV)/.installed
	devices/aarch64-device.sh $(AARCH64_ROOT)
	rm -rf .golden-aarch64 && mkdir .golden-aarch64
	cd "$$(mktemp -d)" && BACKENDCONF_IN_PROCESS=1 $(abspath $(BIN))/python -m pytest --backend=reference -q \
	    --backendconf-select='parity::*[[]float32]' --backendconf-golden=$(abspath .golden-aarch64) >/dev/null
	$(BIN)/backendconf replay .golden-aarch64 --report .golden-aarch64/report.json \
	    --target-command="qemu-aarch64-static -L $(AARCH64_ROOT) $(AARCH64_ROOT)/usr/bin/python3.11"

test-slow: $(VENV)/.installed-onnxruntime $(VENV)/.installed-llm torchscript-built target-venv
	$(BIN)/python -m pytest -n 2 tests -m slow

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build/mypy
