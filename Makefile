# owngate developer entry points. Only needs python3 (3.11+) and make.
#   make demo   - install into .venv (hash-locked) and run `owngate demo`
#   make test   - install, then lint, type-check and run the whole test suite
#   make bench  - install, then run the overhead benchmark (`owngate bench overhead`)
# The benchmarks are a distribution of their own (bench/, `owngate-bench`), installed
# editable after owngate so the runtime wheel carries no benchmark code.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.owngate-installed

.PHONY: demo test lint typecheck pytest lock bench clean

$(STAMP): requirements/dev.lock pyproject.toml bench/pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "owngate needs Python 3.11+")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r requirements/dev.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e ./bench
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/owngate demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	OWNGATE_REQUIRE_REAL_BACKEND=$${OWNGATE_REQUIRE_REAL_BACKEND-1} \
	OWNGATE_REQUIRE_DEPLOY_TOOLS=$${OWNGATE_REQUIRE_DEPLOY_TOOLS-1} $(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/owngate bench overhead

# Re-resolve the hash-locked requirements (needs uv: pip install uv).
lock:
	cd requirements && uv pip compile ../pyproject.toml --extra dev --universal --python-version 3.11 \
		--generate-hashes -c constraints.txt -o dev.lock
	cd requirements && uv pip compile ../pyproject.toml --universal --python-version 3.11 \
		--generate-hashes -c constraints.txt -o runtime.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
