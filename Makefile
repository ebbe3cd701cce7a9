# The product's front door: `make demo` and `make test`, each doing its own set-up from a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
GAGAR := $(VENV)/bin/gagar
WORK ?= .gagar
TASKS := $(WORK)/tasks
# CI runs a reduced count of the slow suites; `make test-full` runs them all.
PYTEST_ARGS ?=

.PHONY: setup venv docker images tasks demo test test-full lint bench reliability clean

setup: venv docker images tasks

venv: $(VENV)/.installed

# torch first, pinned, so pip takes the local CPU wheel instead of a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml requirements.lock
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c requirements.lock -e ".[dev]"
	touch $@

docker:
	bash scripts/ensure_docker.sh

images: venv docker
	$(GAGAR) image build --all

tasks: venv
	$(PY) examples/build_tasks.py --out $(TASKS)

demo: setup
	bash scripts/demo.sh $(WORK)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-full: setup
	GAGAR_FULL=1 $(PY) -m pytest $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) bench/sandbox.py
	$(PY) bench/advantage.py

clean:
	-$(GAGAR) sandbox gc
	rm -rf $(WORK)
