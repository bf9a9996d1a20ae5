# The two user-facing commands:
#   make bench   the main job (semimig's end-to-end benchmark; a short demo until it lands)
#   make test    the test suite
# Both create the virtualenv .venv and install everything on first use (scripts/bootstrap.sh).
VENV ?= .venv
BENCH_ARGS ?=

.PHONY: bench test setup clean

setup:
	VENV=$(VENV) bash scripts/bootstrap.sh

bench: setup
	$(VENV)/bin/semimig bench $(BENCH_ARGS)

test: setup
	$(VENV)/bin/pytest -q --durations=15

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
