# Each target makes its own virtualenv (.venv) and installs what it needs on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
FXKIT := $(VENV)/bin/fxkit
# torch 2.13.0 is the CPU build on this machine's disk; an unpinned torch would pull a CUDA build.
TORCH ?= torch==2.13.0

.PHONY: demo test lint docs bench bench-load system clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[loader,dev,probe,kv]" "$(TORCH)"
	touch $@

system:
	./scripts/install-system-deps.sh

demo: system $(VENV)/.installed
	$(FXKIT) demo

test: system $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -ra

# The loader benchmarks of docs/BENCHMARKS.md (root for the remote-storage emulation; ~25 min).
bench-load: system $(VENV)/.installed
	$(PY) -m pip install -q -e ".[loader,dev,bench]"
	$(PY) bench/load.py

# The generated parts of the docs (the operations and kinds references, the roles' tables of
# variables); tests fail when they are stale.
docs: $(VENV)/.installed
	$(PY) -m fxkit.reference

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
