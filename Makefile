# One entry point for set-up, checks and the demo. Everything installs into .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_FLAGS ?=

.PHONY: venv demo check lint types test test-fast test-e2e protos bench clean

$(STAMP): pyproject.toml constraints/dev.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints/dev.txt -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The main job: a local swarm of real node processes on the built-in digits task.
demo: $(STAMP)
	$(BIN)/murmur swarm --nodes 8 --topology exponential --compress int8

check: lint types test

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types: $(STAMP)
	$(BIN)/mypy

test: test-fast test-e2e

# The MQTT tests start their own mosquitto; scripts/ensure-mosquitto installs it when missing.
test-fast: $(STAMP)
	bash scripts/ensure-mosquitto
	$(BIN)/pytest -m "not e2e" $(PYTEST_FLAGS)

# Many real node processes; slower, so it is its own stage (CI runs it too).
test-e2e: $(STAMP)
	bash scripts/ensure-mosquitto
	$(BIN)/pytest -m e2e $(PYTEST_FLAGS)

protos: $(STAMP)
	$(BIN)/python -m protos.generate

bench: $(STAMP)
	$(BIN)/python -m bench.codec_throughput
	$(BIN)/python -m bench.step_rate

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis *.egg-info
