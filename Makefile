# The two commands a fresh machine needs: `make demo` and `make test`. Everything they need is
# set up from here: the virtualenv with the native core built in, and (tools/setup-system) the
# Debian packages the tests use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# the native core (pure Rust) and its Python face, built into worker._native
NATIVE := Cargo.toml $(wildcard Cargo.lock) native/core/Cargo.toml native/python/Cargo.toml \
	$(shell find native/core/src native/python/src -name '*.rs')
# pyo3's build and the face's test binary (native/python, which links libpython) need to know
# which Python; the pure core (native/core) needs none
CARGO_ENV := PYO3_PYTHON=$(abspath $(BIN)/python) \
	LD_LIBRARY_PATH=$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')

.PHONY: demo test system kafka tools lint typecheck rust unit integration bench fuzz fuzz-judge clean

$(STAMP): pyproject.toml $(NATIVE)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/callgate-demo

system:
	tools/setup-system

# Apache Kafka's jars for the tests' real broker (Maven Central -> .cache/kafka-<version>-*/libs)
kafka: system
	tools/kafka/fetch

# every real part the tests build from registries, into .cache/: Apache Kafka's jars (Maven
# Central), kustomize and the OpenTelemetry Collector (Go module proxy)
tools: kafka
	tools/kustomize/install
	tools/otelcol/build

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

rust: $(STAMP)
	cargo fmt --all --check
	$(CARGO_ENV) cargo clippy --workspace --all-targets -- -D warnings
	$(CARGO_ENV) cargo test --workspace --quiet

# the tests that need no broker run on every core (pytest-xdist: each worker its own process);
# those with brokers one at a time, since they share the session's brokers and time their faults
test: system tools lint typecheck rust
	$(BIN)/pytest -m "not integration" -n auto
	$(BIN)/pytest -m integration

unit: $(STAMP)
	$(BIN)/pytest -m "not integration" -n auto

integration: system tools $(STAMP)
	$(BIN)/pytest -m integration

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# the pure core's fuzz targets (native/fuzz), each for FUZZ_SECONDS (cargo-fuzz and a nightly
# toolchain); new inputs land in native/fuzz/corpus/<target>/, which cargo test replays; then
# the reference judge's properties (tests/reference), each for FUZZ_SECONDS of fresh examples
FUZZ_SECONDS ?= 60
fuzz: $(STAMP)
	cargo +nightly fuzz --version >/dev/null 2>&1 || cargo install --locked cargo-fuzz
	for target in parse envelope assembler early; do \
		cargo +nightly fuzz run --fuzz-dir native/fuzz $$target -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done
	JUDGE_SECONDS=$(FUZZ_SECONDS) $(BIN)/pytest tests/reference -q

# the reference judge alone, for FUZZ_SECONDS per property
fuzz-judge: $(STAMP)
	JUDGE_SECONDS=$(FUZZ_SECONDS) $(BIN)/pytest tests/reference -q

clean:
	rm -rf $(VENV) target .mypy_cache .ruff_cache .pytest_cache
