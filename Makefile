# Two commands a fresh machine with Python 3.11 needs: `make demo` and `make test`.
# Each creates .venv on first use and installs the project (editable) with what it needs.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml examples/rlm-graph-echo-provider/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,grpc]' -e examples/rlm-graph-echo-provider
	touch $(STAMP)

.PHONY: demo test install
install: $(STAMP)

demo: $(STAMP)
	$(BIN)/rlm-graph demo

test: $(STAMP)
	$(BIN)/python -m pytest -q
