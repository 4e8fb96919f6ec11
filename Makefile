# qaina-bench: set-up and entry points. Run as root (Mininet, veth, raw sockets).
#   sudo make up     install what is missing, then run the main job on the embedded switch
#   sudo make test   install what is missing, then run the whole test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
APT_PACKAGES := mininet iproute2 iputils-ping ethtool nftables python3-venv
TOPO ?= leafspine
PYTEST_ARGS ?=

.PHONY: up test deps venv bench clean p4info

up: deps venv
	$(VENV)/bin/qaina-bench up --topo $(TOPO)

test: deps venv
	$(VENV)/bin/pytest $(PYTEST_ARGS)

bench: deps venv
	$(VENV)/bin/qaina-bench bench switch
	$(VENV)/bin/qaina-bench bench codec

# System packages, installed only when missing (idempotent).
deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# The Python environment, rebuilt when pyproject.toml changes.
venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,record]'
	@touch $@

clean:
	$(VENV)/bin/qaina-bench clean

# The committed P4Info is p4c's: regenerate it after changing p4/qaina.p4 (needs p4c).
p4info: venv
	$(VENV)/bin/python -c 'import shutil, sys; from qaina_bench.harness.targets import compile_p4; \
	    shutil.copyfile(compile_p4()[1], "p4/qaina.p4info.txtpb")'

