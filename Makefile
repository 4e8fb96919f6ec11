# qaina-bench: set-up and entry points. Run as root (Mininet, veth, raw sockets):
# as root `make up`, otherwise `sudo make up`.
#   make up     install what is missing, then run the main job on the embedded switch
#   make test   install what is missing, then run the whole test suite
#   make shell-tool  p4runtime-shell in a venv of its own (qaina-bench shell)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# p4runtime-shell pins protobuf < 3.21, the harness needs protobuf 6: two venvs.
# $QAINA_SHELL_VENV moves the shell's (qaina-bench shell and the tests look there).
SHELL_VENV ?= $(or $(QAINA_SHELL_VENV),.venv-shell)
export QAINA_SHELL_VENV := $(abspath $(SHELL_VENV))
P4RUNTIME_SHELL ?= p4runtime-shell==0.0.6
# PyTorch (qaina_bench.torch, up --train-script, the cnn and resnet models, and their
# tests), installed by `make venv`; empty (TORCH=) for none. Take the CPU build: on PyPI,
# Linux's torch is a CUDA build of several GB; TORCH_INDEX=https://download.pytorch.org/whl/cpu
# gets it from PyTorch's own index where pip's does not have it.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
APT_PACKAGES := mininet iproute2 iputils-ping ethtool nftables procps cgroup-tools python3-venv \
  tcpdump tshark
TOPO ?= leafspine
PYTEST_ARGS ?=

SPECS := qaina-jobs gradiveq links loss error levels arrivals sharing

.PHONY: up test docker-test cluster-test deps venv shell-tool bench clean p4info figures figures-quick report

up: deps venv
	$(VENV)/bin/qaina-bench up --topo $(TOPO)

test: deps venv
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The smoke subset in the project's Docker image, with a daemon of its own (docker/smoke.sh).
docker-test:
	docker/smoke.sh

# One leaf-spine run over three containers with --cluster (docker/cluster.sh); TORCH:
# PyTorch for its --train-script run (empty: that run is skipped).
cluster-test:
	TORCH='$(TORCH)' TORCH_INDEX='$(TORCH_INDEX)' docker/cluster.sh

bench: deps venv
	$(VENV)/bin/qaina-bench bench switch
	$(VENV)/bin/qaina-bench bench codec

# Every figure of docs/results.md: each spec's sweep (resumed if it was stopped), then its
# plot; its sweep.csv becomes docs/data/<spec>.csv and the docs' tables are written from it.
figures: deps venv
	@for s in $(SPECS); do \
	  $(VENV)/bin/qaina-bench sweep experiments/$$s.yaml && \
	  $(VENV)/bin/qaina-bench plot results/sweeps/$$s && \
	  cp results/sweeps/$$s/sweep.csv docs/data/$$s.csv || exit $$?; done
	$(VENV)/bin/qaina-bench report

# README's metric glossary and the docs' tables from the registry and docs/data.
report: venv
	$(VENV)/bin/qaina-bench report

# The same at the specs' --quick sizes (a few minutes).
figures-quick: deps venv
	@for s in $(SPECS); do \
	  $(VENV)/bin/qaina-bench sweep --quick experiments/$$s.yaml && \
	  $(VENV)/bin/qaina-bench plot results/sweeps/$$s-quick || exit $$?; done

# System packages, installed only when missing (idempotent).
deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $$missing; \
	fi

# The Python environment, rebuilt when pyproject.toml changes.
venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,record,data]'
	$(if $(TORCH),$(VENV)/bin/pip install -q '$(TORCH)' $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)))
	@touch $@

# p4runtime-shell for `qaina-bench shell` (and its tests), apart from the harness's venv.
shell-tool: $(SHELL_VENV)/.installed

$(SHELL_VENV)/.installed:
	@test -x $(SHELL_VENV)/bin/python || $(PYTHON) -m venv $(SHELL_VENV)
	$(SHELL_VENV)/bin/pip install -q --upgrade pip
	$(SHELL_VENV)/bin/pip install -q '$(P4RUNTIME_SHELL)'
	@touch $@

clean:
	$(VENV)/bin/qaina-bench clean

# The committed P4Info is p4c's: regenerate it after changing p4/qaina.p4 (needs p4c).
p4info: venv
	$(VENV)/bin/python -c 'import shutil, sys; from qaina_bench.harness.switches.targets import compile_p4; \
	    shutil.copyfile(compile_p4()[1], "p4/qaina.p4info.txtpb")'

