# Modelport: `make run` starts the portal with embedded defaults, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME_ENV := var/runtime-env
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test test-fast lint typecheck venv runtime-env browser-deps observability-deps bench samples clean

venv: $(VENV)/.installed $(VENV)/bin/modelport
# The portal's requirements and what tests, linters and benchmarks add (requirements-dev.txt includes
# requirements.txt); the image in platform/ installs requirements.txt alone.
$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements-dev.txt
	touch $@
# The `modelport` CLI the deployment page's snippets use, editable from this checkout (its dependencies are in
# requirements.txt already): .venv/bin/modelport, or `modelport` after `source .venv/bin/activate`. A target of
# its own, so that a venv made before it gets the command at the next `make run`.
$(VENV)/bin/modelport: pyproject.toml $(VENV)/.installed
	$(VENV)/bin/pip install --quiet --no-deps -e .
	touch $@

# The local Triton runtime's own environment (tritonserver from nvidia-pytriton, numpy<2, onnxruntime), plus the
# frameworks named in RUNTIME_EXTRAS (torch, tensorflow; comma-separated), each from requirements-runtime-<extra>.txt:
# `make run RUNTIME_EXTRAS=torch,tensorflow`. The portal's MODELPORT_RUNTIME_EXTRAS setting gives the default.
# Sizes and times in docs/local-runtime.md. An extra stays installed once added; the portal detects what is there.
comma := ,
RUNTIME_EXTRAS ?= $(MODELPORT_RUNTIME_EXTRAS)
RUNTIME_EXTRA_MARKERS := $(foreach extra,$(subst $(comma), ,$(RUNTIME_EXTRAS)),$(RUNTIME_ENV)/.extra-$(extra))
runtime-env: $(RUNTIME_ENV)/.installed $(RUNTIME_EXTRA_MARKERS)
$(RUNTIME_ENV)/.installed: requirements-runtime.txt
	$(PYTHON) -m venv $(RUNTIME_ENV)
	$(RUNTIME_ENV)/bin/pip install --quiet --upgrade pip
	$(RUNTIME_ENV)/bin/pip install --quiet -r requirements-runtime.txt
	touch $@
# The base requirements are constraints, so an extra never moves numpy (nvidia-pytriton needs <2) or onnxruntime.
$(RUNTIME_ENV)/.extra-%: requirements-runtime-%.txt $(RUNTIME_ENV)/.installed
	$(RUNTIME_ENV)/bin/pip install --quiet -r $< -c requirements-runtime.txt
	touch $@

run: venv runtime-env
	$(PY) manage.py ensure_dirs
	$(PY) manage.py migrate --noinput
	$(PY) manage.py ensure_admin
	HOST=$(HOST) PORT=$(PORT) bin/run-portal

# Stop a `make run` from another terminal (same MODELPORT_VAR_DIR); it says what keeps running (local Triton
# servers, adopted at the next start) and how to stop that too: `make stop-triton`.
.PHONY: stop stop-triton
stop:
	@bin/run-portal stop
stop-triton:
	@bin/run-portal stop-triton

# The whole suite includes the tests marked `frameworks`, so the runtime env gets both extras (once: about 100 s
# here, from this machine's disk and the package index; see docs/local-runtime.md).
test: venv runtime-env $(RUNTIME_ENV)/.extra-torch $(RUNTIME_ENV)/.extra-tensorflow browser-deps observability-deps lint
	$(PY) -m pytest

# tests/test_schema_fuzz.py holds fuzz tests only; left out, not collected: schemathesis builds its cases at collection.
# Bytecode is written even where the environment says not to (PYTHONDONTWRITEBYTECODE, set on this machine): compiling
# the project and rewriting the tests' asserts again took 6 of the fast suite's seconds of CPU in every run after the
# first (docs/benchmarks.md, "The fast test suite").
test-fast: venv
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -m "not triton and not worker and not browser and not s3 and not kube and not frameworks and not faults and not fuzz and not slow" \
		--ignore=tests/test_schema_fuzz.py

# The API fuzzed against its OpenAPI schema alone, deeper than in `make test`: make fuzz FUZZ_EXAMPLES=500 FUZZ_SEED=$RANDOM
.PHONY: fuzz
fuzz: venv
	$(PY) -m pytest -m fuzz tests/test_schema_fuzz.py

# End to end on the cluster KUBECONFIG points at, through a Modelport installed there (docs/kubernetes.md):
# MODELPORT_URL=https://... MODELPORT_TOKEN=mp_... make e2e-k8s. Not part of `make test`.
.PHONY: e2e-k8s
e2e-k8s: venv
	$(PY) -m tests.e2e_k8s

# lint-imports: the layers and independence contracts in pyproject.toml (docs/architecture.md, "Layers").
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports

# Debian's Chromium and ChromeDriver for the browser tests (no browser download from elsewhere).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }

# Debian's Prometheus (promtool and the server) for the tests of platform/observability's rules and dashboards
# (tests/test_observability.py). --no-install-recommends: not the exporters and the console libraries.
observability-deps:
	@command -v promtool >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

# The serving benchmark (docs/benchmarks.md, bench/serving/): its own env, var/bench-env (torch first: the CPU build
# on this machine's disk), and `tokenizers` added to the runtime env for workload 3's tokenization step in Triton.
# About 45 minutes with the peers; `make bench BENCH_ARGS=--quick` is a smoke test.
BENCH_ENV := var/bench-env
PEERS := mlserver bentoml litserve
PEER_ENVS := $(foreach peer,$(PEERS),var/peers/$(peer)/.installed)
bench: venv runtime-env $(BENCH_ENV)/.installed $(PEER_ENVS)
	$(RUNTIME_ENV)/bin/pip install --quiet $$(grep '^tokenizers==' bench/requirements-bench.txt)
	$(PY) -m bench.serving.run $(BENCH_ARGS)
$(BENCH_ENV)/.installed: bench/requirements-bench.txt
	$(PYTHON) -m venv $(BENCH_ENV)
	$(BENCH_ENV)/bin/pip install --quiet --upgrade pip
	$(BENCH_ENV)/bin/pip install --quiet torch==2.13.0
	$(BENCH_ENV)/bin/pip install --quiet -r bench/requirements-bench.txt
	touch $@

# The servers users pick instead of Modelport (the "peers" of the serving benchmark), each in its own env, since
# their pins clash with each other's and ours: var/peers/<peer> from bench/peers/requirements-<peer>.txt.
# `make bench BENCH_ARGS=--peers-only` measures only them against Modelport's e, on workloads 2 and 3.
var/peers/%/.installed: bench/peers/requirements-%.txt
	$(PYTHON) -m venv var/peers/$*
	var/peers/$*/bin/pip install --quiet --upgrade pip
	var/peers/$*/bin/pip install --quiet -r $<
	touch $@

# The README's pictures (docs/screenshots/*.png), taken by the browser tests; `make test` writes them elsewhere.
.PHONY: screenshots
screenshots: venv runtime-env browser-deps
	MODELPORT_SCREENSHOTS_DIR=$(CURDIR)/docs/screenshots $(PY) -m pytest tests/test_browser_e2e.py

samples: venv
	$(PY) manage.py make_sample_models var/samples

clean:
	rm -rf var/celery var/deployments
