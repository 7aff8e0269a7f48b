# tilesmith: `make demo` runs the main job on an embedded example; `make test` runs the CPU tests.
# Both install what they need into .venv on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install test demo gpu-test bench-gpu lint clean

$(BIN)/tilesmith: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# Never replace a torch that is already there; on a machine with none, take the CPU build 2.13.0.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q numpy pytest -e '.[agent]'
	touch $(BIN)/tilesmith

install: $(BIN)/tilesmith

test: install
	$(BIN)/python -m pytest -q -x --durations=10

demo: install
	$(BIN)/python examples/demo.py

# On the GPU machine: its own torch, no venv, no registry (pytest, typer, rich are there).
gpu-test:
	PYTHONPATH=$(CURDIR) python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider

lint:
	$(BIN)/python -m pyflakes tilesmith tilesmith_cli tests 2>/dev/null || $(BIN)/python -m compileall -q tilesmith tilesmith_cli

clean:
	rm -rf $(VENV) tilesmith-workspace
