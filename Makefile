# Skewless: `make demo` runs the whole pipeline, `make test` the test suite. Both install what is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NATIVE_STAMP := $(VENV)/.native-built
NATIVE_SOURCES := native/Cargo.toml native/Cargo.lock native/pyproject.toml $(wildcard native/src/*.rs native/src/*/*.rs)
CARGO ?= $(shell command -v cargo || echo $(HOME)/.cargo/bin/cargo)

.PHONY: help native setup demo test test-long test-unit test-integration lint bench reliability docs-settings clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[gateway,spark,dev]'
	touch $(STAMP)

# The native data plane (native/, Rust + PyO3), built with maturin into the venv; rebuilt when its sources change.
$(NATIVE_STAMP): $(STAMP) $(NATIVE_SOURCES)
	bash scripts/setup-rust.sh
	PATH="$(dir $(CARGO)):$$PATH" $(BIN)/maturin develop --quiet --release --manifest-path native/Cargo.toml
	touch $(NATIVE_STAMP)

native: $(NATIVE_STAMP) ## build the Rust data plane into the venv

setup: $(STAMP) $(NATIVE_STAMP) ## venv + Python deps, the Rust data plane, Kafka/Spark jars, NTP interop tools
	bash scripts/setup-system.sh
	$(BIN)/skewless setup

demo: setup ## Kafka + gateway + simulated sources + Spark window job, verified, then shut down
	$(BIN)/skewless demo

test: setup ## the suite CI runs: cargo test, unit, integration (real Kafka/Spark/NTP tools), fast reliability
	cd native && PYO3_PYTHON=$(abspath $(BIN))/python $(CARGO) test --quiet
	$(BIN)/pytest -m 'not reliability_long' tests/unit -n 2 --durations=20
	$(BIN)/pytest -m 'not reliability_long' tests/integration tests/reliability --durations=40

test-long: setup ## the long reliability scenarios only (10^6 fuzz inputs, 30 s stalls, full load)
	$(BIN)/pytest -m reliability_long

test-unit: $(STAMP) $(NATIVE_STAMP) ## unit tests only (no external processes), on two cores
	$(BIN)/pytest tests/unit -n 2

lint: $(STAMP) ## ruff + mypy (strict) + hadolint + cargo fmt/clippy
	bash scripts/setup-rust.sh
	cd native && $(CARGO) fmt --check && PYO3_PYTHON=$(abspath $(BIN))/python $(CARGO) clippy --quiet --all-targets -- -D warnings
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/hadolint Dockerfile deploy/spark.Dockerfile

bench: setup ## run every benchmark; figures and plots land in docs/
	for b in benchmarks/*.py; do case $$b in */__init__.py) ;; *) $(BIN)/python -m benchmarks.$$(basename $$b .py) || exit 1;; esac; done

reliability: setup ## the reliability campaign (fast + long suites, load run); regenerates docs/reliability.md
	$(BIN)/python -m benchmarks.harness.campaign

docs-settings: $(STAMP) ## rewrite docs/operations.md's gateway settings tables from gateway/settings.py
	$(BIN)/python -m scripts.settings_doc

clean: ## remove the venv and fetched jars
	rm -rf $(VENV) .cache
