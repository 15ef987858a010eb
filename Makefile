# One entry point for set-up, checks and the demo. Everything installs into .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_FLAGS ?=

.PHONY: venv demo check lint types test test-fast test-e2e test-testbed protos bench clean \
	testbed testbed-swarm testbed-down testbed-report testbed-wheelhouse hivemind-env

$(STAMP): pyproject.toml constraints/dev.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints/dev.txt -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The main job: a local swarm of real node processes on the built-in digits task.
demo: $(STAMP)
	$(BIN)/murmur swarm --nodes 8 --topology exponential --compress int8

# lint, types, test-fast, test-e2e and test-testbed in that order, stopping at the first that
# fails; the testbed's downloads go on in the background meanwhile (scripts/check).
check:
	bash scripts/check

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

# Many real node processes; slower, so it is its own stage (CI runs it too). The ten slowest
# are listed at the end: the stage is most of make check's time budget.
test-e2e: $(STAMP)
	bash scripts/ensure-mosquitto
	bash scripts/ensure-iptables
	$(BIN)/pytest -m e2e --durations=10 $(PYTEST_FLAGS)

# The docker-compose testbed from nothing: Docker and Compose from Debian's packages, an engine
# of its own, a base image from Debian's packages when no registry answers, the node image from
# the wheelhouse; then a run with a crash and a restart, checked, and everything torn down. Needs
# root on a machine without Docker (as CI is).
test-testbed: $(STAMP)
	bash scripts/testbed ci

# Build, bring up and watch the testbed (docker/README.md); NODES=5 for more nodes.
testbed:
	bash scripts/testbed up

# The same nodes in Docker Swarm mode (docker stack deploy of docker/stack.yml), a volume per task.
testbed-swarm:
	bash scripts/testbed swarm

testbed-report:
	bash scripts/testbed report

testbed-down:
	bash scripts/testbed down

# Every wheel the node image needs (the project's own is built in the image), for an image built
# without network. Made with the constraints, so it holds the CPU build of torch.
WHEELHOUSE := docker/wheelhouse/.stamp
$(WHEELHOUSE): pyproject.toml constraints/dev.txt | $(STAMP)
	rm -f docker/wheelhouse/*.whl
	$(BIN)/python -m pip wheel --quiet -c constraints/dev.txt -w docker/wheelhouse '.[digits,plots]' 'setuptools>=69'
	rm -f docker/wheelhouse/murmur-*.whl
	touch $@

testbed-wheelhouse: $(WHEELHOUSE)

protos: $(STAMP)
	$(BIN)/python -m protos.generate

bench: $(STAMP)
	$(BIN)/python -m bench.codec_throughput
	$(BIN)/python -m bench.step_rate

# hivemind, the peer system bench/slow_links.py compares with (its `hivemind` systems), in an
# environment of its own: it pins its own dependencies. Not needed by any test.
HIVEMIND_VENV := .venv-hivemind
hivemind-env: $(HIVEMIND_VENV)/.installed-stamp
$(HIVEMIND_VENV)/.installed-stamp: constraints/hivemind.txt
	test -x $(HIVEMIND_VENV)/bin/python || $(PY) -m venv $(HIVEMIND_VENV)
	$(HIVEMIND_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		-c constraints/hivemind.txt torch scikit-learn hivemind
	touch $@

clean:
	rm -rf $(VENV) $(HIVEMIND_VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis *.egg-info
