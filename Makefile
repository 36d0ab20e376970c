# Two commands a fresh machine with Python 3.11 needs: `make demo` and `make test`.
# Each creates .venv on first use and installs the project (editable) with what it needs.
# The checkout's own paths, whatever folder make runs in (`make -f path/to/Makefile test`).
PYTHON ?= python3.11
ROOT := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
VENV := $(ROOT)/.venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): $(ROOT)/pyproject.toml $(ROOT)/examples/rlm-graph-echo-provider/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '$(ROOT)[test,grpc,mcp,docs]' -e $(ROOT)/examples/rlm-graph-echo-provider
	touch $(STAMP)

.PHONY: demo test quick install browser
install: $(STAMP)

# The HTML report's tests open it in a real headless Chromium (Debian's package; a
# browser download of Playwright's own is not possible on CI). Installed when missing;
# needs root, as on CI. Without it those tests are skipped, saying why. Where /tmp is
# not writable by all (mode 0700, as on CI), apt's downloads run as root: its sandbox
# user (_apt) cannot write its files there, and every index fails its signature check.
APT := apt-get -q $(if $(filter 1777,$(shell stat -c %a /tmp 2>/dev/null)),,-o APT::Sandbox::User=root)
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { echo "installing chromium (Debian package) for the report's browser tests"; \
	    { $(APT) update && DEBIAN_FRONTEND=noninteractive $(APT) install -y chromium; } >/dev/null || \
	    { echo "could not install chromium"; test -z "$$CI"; }; }

demo: $(STAMP)
	$(BIN)/rlm-graph demo

# Two workers (pytest-xdist), one test file each at a time and the tests on a Ray cluster
# on one of them (tests/conftest.py groups them): the suite's time is mostly waiting
# (other processes, servers, sleeps by design), so two cores take it in about two thirds
# of the time one does.
test: $(STAMP) browser
	cd $(ROOT) && .venv/bin/python -m pytest -q -n 2 --dist loadfile

# The inner loop: everything but the slow tiers (Ray, the browser, mypy, tests that start
# another process, tests slow by design); `make test` runs them all.
quick: $(STAMP)
	cd $(ROOT) && .venv/bin/python -m pytest -q -m "not (ray or browser or mypy or processes or slow)"
