# tilesmith: `make demo` runs the main job on an embedded example; `make test` runs the CPU tests.
# Both install what they need into .venv on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install test test-ray demo gpu-wheels gpu-deps gpu-smoke gpu-test gpu-test-groups gpu-test-run bench-gpu lint clean

# A python that already has torch (a GPU machine's CUDA build): the venv sees its packages and pip never replaces
# them. There, with no registry, the wheels carried in .whl/ (`make gpu-wheels` where pip works) are the only source.
HAS_TORCH := $(shell $(PY) -c "import torch" >/dev/null 2>&1 && echo 1)
OFFLINE := $(if $(HAS_TORCH),$(wildcard .whl/*.whl))

$(BIN)/tilesmith: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# The outer python's packages stay visible behind the venv's own (a .pth, since that python may itself be a
	# venv's, whose packages --system-site-packages would not show).
	$(if $(HAS_TORCH),$(PY) -c "import site; print(chr(10).join(site.getsitepackages()))" > \
		"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_outer_site.pth")
ifneq ($(OFFLINE),)
	# Offline: the carried wheels as they are (no resolver, as `make gpu-deps` does), then tilesmith itself.
	$(BIN)/python -m pip install -q --no-index --no-deps .whl/*.whl
	$(BIN)/python -m pip install -q --no-index --no-deps --no-build-isolation -e .
else
	$(BIN)/python -m pip install -q --upgrade pip
	# Never replace a torch that is already there; on a machine with none, take the CPU build 2.13.0.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	# transformers: the gate's honest corpus builds real models from their configurations (tests/corpus.py).
	$(BIN)/python -m pip install -q numpy pytest pytest-xdist transformers -e '.[agent]'
endif
	touch $(BIN)/tilesmith

install: $(BIN)/tilesmith

# Two test processes, whole files to each (module fixtures made once): 16-21 minutes on a 2-core VM.
test: install
	$(BIN)/python -m pip show -q pytest-xdist >/dev/null 2>&1 || $(BIN)/python -m pip install -q pytest-xdist
	$(BIN)/python -m pytest -q -x --durations=10 -n 2 --dist loadfile

# Opt-in (minutes on 2 cores): `optimize --ray` on a Ray cluster started on loopback by the tests (tests/test_scale_ray.py).
test-ray: install
	$(BIN)/python -c "import ray" 2>/dev/null || $(BIN)/python -m pip install -q -e '.[ray]'
	$(BIN)/python -m pytest -q -m ray --durations=5 tests/test_scale_ray.py

demo: install
	$(BIN)/python examples/demo.py

# On the GPU machine: its own torch, no venv, no registry (pytest, typer, rich are there; wheels for
# the rest, e.g. tomli-w, are carried in .whl/ and unpacked to /tmp/site first). Results go to $(OUT).
OUT ?= gpu-out
GPU_ENV := PYTHONPATH=$(CURDIR):/tmp/site PYTHONUNBUFFERED=1
# Here, before a GPU call: the wheels it needs, for Python 3.12 on x86_64 (18 MB; carry `.whl`).
gpu-wheels:
	grep -qx '/.whl/' .git/info/exclude || echo /.whl/ >> .git/info/exclude
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
		--platform manylinux_2_34_x86_64 -d .whl -r benchmarks/gpu-wheels.txt

# One device call on a fresh GPU machine (carry .whl): install, the README's flow on examples/moe.py in
# reduce-overhead and default mode, the gate's honest corpus and the GPU red team; a PASS/FAIL line per step.
gpu-smoke: install
	OUT=$(OUT) PY=$(BIN)/python bash tests/gpu/smoke.sh

gpu-deps:
	test -d .whl && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || true

# GPU_TESTS picks files and TAG names the results, so several groups can run side by side in one call:
#   make gpu-deps; make gpu-test-run GPU_TESTS=tests/gpu/test_gate_gpu.py TAG=gate & ...
GPU_TESTS ?= tests/gpu
TAG ?= all
gpu-test: gpu-deps gpu-test-run

gpu-test-groups: gpu-deps
	$(GPU_ENV) OUT=$(OUT) bash tests/gpu/run_groups.sh

gpu-test-run:
	mkdir -p $(OUT)
	$(GPU_ENV) python3 -m pytest -q -m gpu $(GPU_TESTS) -p no:cacheprovider --basetemp=/tmp/pytest-$(TAG) \
		--durations=15 --junitxml=$(OUT)/gpu-tests-$(TAG).xml

# The model suite (MODELS=..., two per call), the replay host time, then the gate calibration with the time left:
bench-gpu: gpu-deps
	$(GPU_ENV) OUT=$(OUT) bash benchmarks/gpu_bench.sh

lint: install
	$(BIN)/python -m pip install -q pyflakes
	$(BIN)/python -m pyflakes tilesmith tilesmith_cli tests benchmarks benchmark.py moe_benchmark.py examples

clean:
	rm -rf $(VENV) tilesmith-workspace
