# The two entry points of the README. Both do their own set-up (idempotent) first.
.PHONY: setup demo test test-unit lint bench-quick lock

VENV := .venv
RUN := $(VENV)/bin

setup:
	bash scripts/setup.sh

demo: setup
	$(RUN)/ragpilot demo

test: setup
	$(RUN)/ruff check src tests bench
	$(RUN)/python -m pytest -q --durations=30 tests

# The fast tier (tests/unit: no Ray, no model weights, no index builds); `make test` runs it too.
test-unit: setup
	$(RUN)/python -m pytest -q tests/unit

lint: setup
	$(RUN)/ruff check src tests bench
	$(RUN)/ruff format --check src tests bench

# Re-resolve the dependencies afresh and rewrite constraints.txt (what setup and CI install).
lock:
	bash scripts/lock.sh
