# Two commands do everything: `make run` (the default job) and `make test` (the test suite).
# Each creates the virtual environment and installs what it needs the first time.
PYTHON ?= python3
VENV ?= .venv
# VENV_FLAGS=--system-site-packages reuses a torch (e.g. a CUDA build) already installed system-wide.
VENV_FLAGS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test test-all lint typecheck check bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	@# torch: keep one that is already there (CPU or CUDA); else CUDA only where a GPU driver is.
	@if $(PY) -c "import torch" >/dev/null 2>&1; then \
		echo "torch $$($(PY) -c 'import torch; print(torch.__version__)') already installed: left as is"; \
	elif command -v nvidia-smi >/dev/null 2>&1; then \
		$(PY) -m pip install -q "torch>=2.4"; \
	else \
		$(PY) -m pip install -q torch==2.13.0; \
	fi
	$(PY) -m pip install -q -e ".[dev]"
	@touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/schedlab run experiment=quickstart $(ARGS)

# The suite runs a test file per worker process (pytest-xdist), one worker per core up to 4;
# TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not gpu and not benchmark" $(ARGS)

bench: $(STAMP)
	$(PY) -m pytest -q -m benchmark tests/benchmarks $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	PY=$(PY) .ci/typecheck

# what CI runs (.ci/run): the tests, ruff and mypy
check: test lint typecheck

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
