# framefuse: on a fresh machine, two commands do everything:
#   make demo    create .venv, install, export, rewrite, build, check and run the default model (min_gru)
#   make test    create .venv, install, run the tests
# Others: make kernels (compile the CUDA kernels ahead of time), make clean, make help.

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
PIP := $(PY) -m pip install --disable-pip-version-check $(LOCAL_WHEELS) $(PIP_ARGS)

# The install is redone only when pyproject.toml changes: the stamp's name carries its hash.
PYPROJECT_HASH := $(shell $(PYTHON) -c "import hashlib;print(hashlib.sha256(open('pyproject.toml','rb').read()).hexdigest()[:16])")
STAMP := $(VENV)/.framefuse-installed-$(PYPROJECT_HASH)

PYTEST_ARGS ?= -q
DEMO_ARCH ?= min_gru
ARTIFACTS ?= artifacts

.PHONY: help venv test demo demo-export demo-rewrite demo-build demo-run kernels clean distclean

help:
	@sed -n '1,5p' Makefile | sed 's/^# \{0,1\}//'

venv: $(STAMP)

$(STAMP):
	@test -x $(PY) || { echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	$(PIP) '$(TORCH_SPEC)'
	$(PIP) -e '.[$(EXTRAS)]'
	@rm -f $(VENV)/.framefuse-installed-*
	@touch $@

test: venv
	$(PY) -m pytest $(PYTEST_ARGS)

# The demo is a chain of pipeline stages: export both forms, rewrite both (parity against the
# original in ONNX Runtime), build the step form's engine (cuda-graph engine on a GPU, the CPU
# executor elsewhere), check it against ONNX Runtime, and run it in a 60 Hz game loop.
DEMO_STAGES := demo-export demo-rewrite demo-build demo-run
DEMO_FRAMES ?= 120

demo: $(DEMO_STAGES)
	@echo
	@echo "make demo: done. Artifacts of '$(DEMO_ARCH)':"
	@for d in $(ARTIFACTS)/$(DEMO_ARCH) $(ARTIFACTS)/$(DEMO_ARCH)-step; do echo "  $$d/: $$(ls $$d | tr '\n' ' ')"; done

demo-export: venv
	$(FRAMEFUSE) export --arch $(DEMO_ARCH) --form both -o $(ARTIFACTS)

demo-rewrite: demo-export
	$(FRAMEFUSE) rewrite $(ARTIFACTS)/$(DEMO_ARCH)/model.onnx
	$(FRAMEFUSE) rewrite $(ARTIFACTS)/$(DEMO_ARCH)-step/model.onnx

demo-build: demo-rewrite
	$(FRAMEFUSE) build $(ARTIFACTS)/$(DEMO_ARCH)-step/model.fused.onnx
	$(FRAMEFUSE) check $(ARTIFACTS)/$(DEMO_ARCH)-step

demo-run: demo-build
	$(FRAMEFUSE) run $(ARTIFACTS)/$(DEMO_ARCH)-step --frames $(DEMO_FRAMES)

kernels: venv
	$(PY) -m framefuse.plugins.build_kernels

clean:
	rm -rf $(ARTIFACTS) build .pytest_cache .hypothesis

distclean: clean
	rm -rf $(VENV)
