# owngate developer entry points. Only needs python3 (3.11+) and make.
#   make demo   - install into .venv (hash-locked) and run `owngate demo`
#   make test   - install, then lint, type-check and run the whole test suite: every marker
#                 group too (redis, real_backend, deploy_tools, bench), so a missing
#                 prerequisite fails; locally, opt out with `.venv/bin/pytest -m "not redis"`
#   make bench  - install, then run the overhead benchmark (`owngate bench overhead`)
# The benchmarks are a distribution of their own (bench/, `owngate-bench`), installed
# editable after owngate so the runtime wheel carries no benchmark code.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.owngate-installed
# pytest-xdist processes for `make test` (0: one process, the default and CI's): the suite
# mostly waits on sockets and child processes, so more workers than cores pays; each test
# module stays on one worker (--dist loadfile). Opt-in: a parallel run on a loaded machine
# still met failures that depend on which modules share a worker (tests/README.md).
TEST_WORKERS ?= 0

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
	$(BIN)/pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

bench: $(STAMP)
	$(BIN)/owngate bench overhead

# Re-resolve the hash-locked requirements (needs uv: pip install uv), and the lock of the
# LiteLLM proxy's virtualenv the overhead benchmark installs (bench/owngate_bench/).
BENCH_LOCK := uv pip compile litellm-proxy.in --universal --python-version 3.11 \
	--generate-hashes -c ../../requirements/constraints.txt -o litellm-proxy.lock
lock:
	cd requirements && uv pip compile ../pyproject.toml --extra dev --universal --python-version 3.11 \
		--generate-hashes -c constraints.txt -o dev.lock
	cd requirements && uv pip compile ../pyproject.toml --universal --python-version 3.11 \
		--generate-hashes -c constraints.txt -o runtime.lock
	cd bench/owngate_bench && $(BENCH_LOCK) \
		--custom-compile-command "cd bench/owngate_bench && $(BENCH_LOCK)"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
