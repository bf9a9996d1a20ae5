# The user-facing commands:
#   make bench   the main job: semimig bench's slow-device experiment (a whole slow device, Colossal-AI alone
#                beside reshard and semi, and healthy; ~5 min on 2 cores); BENCH_ARGS="--experiment paper"
#                runs the paper's GEMM-only sweep instead
#   make test    the test suite (the full suite; the 15 slowest cases listed at the end)
#   make test-fast   the edit loop: every case not marked slow (tests/conftest.py: SLOW_MODULES)
#   (tests/unit: one process; tests/multirank: gloo ranks; tests/e2e: CLI, torchrun, scripts; e.g.
#    .venv/bin/pytest -q tests/unit runs the pure cases alone)
#   (PYTEST_WORKERS=2 runs either on 2 xdist workers, ~25 % faster; timing-dependent cases can fail
#    under it, so CI and the default stay serial)
#   make tables  the generated tables of README.md and docs/results.md, rewritten from docs/results/index.json
#                and its result files (scripts/readme_tables.py; `make tables-check` writes nothing)
# Each creates the virtualenv .venv and install everything on first use (scripts/bootstrap.sh).
VENV ?= .venv
BENCH_ARGS ?=
PYTEST_WORKERS ?= 0

.PHONY: bench test test-fast tables tables-check setup clean

setup:
	VENV=$(VENV) bash scripts/bootstrap.sh

bench: setup
	$(VENV)/bin/semimig bench $(BENCH_ARGS)

test: setup
	$(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --durations=15

test-fast: setup
	$(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --durations=15 -m "not slow"

tables: setup
	$(VENV)/bin/python scripts/readme_tables.py

tables-check: setup
	$(VENV)/bin/python scripts/readme_tables.py --check

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
