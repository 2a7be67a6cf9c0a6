# framefuse: on a fresh machine, two commands do everything:
#   make demo    create .venv, install, export, rewrite, build, check and run the default model (min_gru)
#   make test    create .venv, install, run the tests
# `make help` lists every target (from the `## ` comment after each target's name).

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
FRAMEFUSE := $(PY) -m framefuse

# torch goes in first, pinned: left to `pip install -e .` it would resolve torch from the
# index, which for Linux is the multi-GB CUDA build. On our CPU machines torch==2.13.0 is a
# CPU wheel on disk. Override for another machine, e.g.
#   make test TORCH_SPEC='torch==2.11.0' PIP_ARGS='--index-url https://download.pytorch.org/whl/cu128'
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,gpu
PIP_ARGS ?=
# Wheels kept beside the checkout (gitignored .whl/) are used when present.
LOCAL_WHEELS := $(if $(wildcard .whl/*.whl),--find-links .whl)
# The tested versions of every dependency (constraints.txt); `make upgrade-deps` moves them on.
# CONSTRAINTS= (empty) installs the newest versions pyproject.toml allows instead.
CONSTRAINTS ?= constraints.txt
CONSTRAINT_ARGS := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
PIP := $(PY) -m pip install --disable-pip-version-check $(LOCAL_WHEELS) $(PIP_ARGS)

# The install is redone only when pyproject.toml or the constraints change: the stamp's name
# carries their hash.
PYPROJECT_HASH := $(shell $(PYTHON) -c "import hashlib;print(hashlib.sha256(b''.join(open(f,'rb').read() for f in ['pyproject.toml'] + '$(CONSTRAINTS)'.split())).hexdigest()[:16])")
STAMP := $(VENV)/.framefuse-installed-$(PYPROJECT_HASH)

# The suite runs on every core (pytest-xdist): most of its time is g++/nvcc compiles and emulated
# kernels, each a process of its own. PYTEST_ARGS='-q -n 0' runs it in one process.
PYTEST_ARGS ?= -q -n auto --durations=30
DEMO_ARCH ?= min_gru
ARTIFACTS ?= artifacts

.PHONY: help venv upgrade-deps test lint demo demo-export demo-rewrite demo-build demo-run kernels clean distclean

help: ## list every target
	@echo "make TARGET (variables: DEMO_ARCH=$(DEMO_ARCH) DEMO_ENGINE=$(or $(DEMO_ENGINE),<default>) DEMO_FRAMES=$(DEMO_FRAMES) PYTEST_ARGS=...)"
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-zA-Z_-]+):.*## (.*)/\1|\2/' | awk -F'|' '{printf "  %-14s %s\n", $$1, $$2}'

venv: $(STAMP) ## create .venv and install framefuse with its dev/gpu extras at the tested versions (constraints.txt)

$(STAMP):
	@test -x $(PY) || { echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	$(PIP) $(CONSTRAINT_ARGS) '$(TORCH_SPEC)'
	$(PIP) $(CONSTRAINT_ARGS) -e '.[$(EXTRAS)]'
	@rm -f $(VENV)/.framefuse-installed-*
	@touch $@

upgrade-deps: venv ## re-resolve the newest dependency versions, rewrite constraints.txt, run the tests
	$(PIP) --upgrade --upgrade-strategy eager -e '.[$(EXTRAS)]'
	@{ sed -n '/^#/p' constraints.txt; $(PY) -m pip freeze --exclude-editable --disable-pip-version-check \
	   | grep -viE '^(torch|nvidia-|triton|framefuse)([=_-]|$$)'; } > constraints.txt.new
	@mv constraints.txt.new constraints.txt
	@rm -f $(VENV)/.framefuse-installed-*
	@$(MAKE) --no-print-directory venv test
	@echo "upgrade-deps: constraints.txt rewritten and the tests passed; review 'git diff constraints.txt' and commit it"

test: venv ## run the test suite (GPU tests skip without a GPU)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: venv ## ruff check and ruff format --check over the tree (config: [tool.ruff] in pyproject.toml)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The demo is a chain of pipeline stages: export both forms, rewrite both (parity against the
# original in ONNX Runtime), build the step form's engine (the cuda-graph engine on a GPU, the
# ONNX Runtime engine on the original graph without one; DEMO_ENGINE=NAME picks one), check the
# fused graph and the engine against ONNX Runtime, and run the engine in a 60 Hz game loop.
DEMO_STAGES := demo-export demo-rewrite demo-build demo-run
DEMO_FRAMES ?= 120
DEMO_ENGINE ?=
ENGINE_FLAG := $(if $(DEMO_ENGINE),--engine $(DEMO_ENGINE))

demo: $(DEMO_STAGES) ## export, rewrite, build, check and run the default model (DEMO_ARCH) in a 60 Hz game loop
	@echo
	@echo "make demo: done. Artifacts of '$(DEMO_ARCH)':"
	@for d in $(ARTIFACTS)/$(DEMO_ARCH) $(ARTIFACTS)/$(DEMO_ARCH)-step; do echo "  $$d/: $$(ls $$d | tr '\n' ' ')"; done

demo-export: venv ## export both forms of DEMO_ARCH into ARTIFACTS (artifacts/)
	$(FRAMEFUSE) export --arch $(DEMO_ARCH) --form both -o $(ARTIFACTS)

demo-rewrite: demo-export ## rewrite both forms into model.fused.onnx (parity-checked)
	$(FRAMEFUSE) rewrite $(ARTIFACTS)/$(DEMO_ARCH)/model.onnx
	$(FRAMEFUSE) rewrite $(ARTIFACTS)/$(DEMO_ARCH)-step/model.onnx

demo-build: demo-rewrite ## build the step form's engine and check it against ONNX Runtime
	$(FRAMEFUSE) build $(ARTIFACTS)/$(DEMO_ARCH)-step $(ENGINE_FLAG)
	$(FRAMEFUSE) check $(ARTIFACTS)/$(DEMO_ARCH)-step $(ENGINE_FLAG)

demo-run: demo-build ## run the step engine in a 60 Hz game loop (p50/p99, budget overruns)
	$(FRAMEFUSE) run $(ARTIFACTS)/$(DEMO_ARCH)-step --frames $(DEMO_FRAMES) $(ENGINE_FLAG)

kernels: venv ## compile the CUDA kernels ahead of time (fatbins for every supported GPU)
	$(PY) -m framefuse.plugins.build_kernels

clean: ## remove artifacts, build outputs and test caches
	rm -rf $(ARTIFACTS) build .pytest_cache .hypothesis .ruff_cache

distclean: clean ## clean, and remove .venv
	rm -rf $(VENV)
