# Two entry points for a fresh machine: `make quickstart` (train) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# checkov lives apart: its pins (boto3, packaging) clash with the project's
CHECKOV := .venv-checkov/bin/checkov

# these machines' environment sets PYTHONDONTWRITEBYTECODE: every python process (each xdist worker, each
# fsdpctl or torchrun process a test starts) would compile the sources and rewrite the tests' asserts again,
# seconds of CPU each; with it unset the bytecode is kept in __pycache__ (git-ignored)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install quickstart test test-all conformance test-fast golden lint docs bench fuzz

# Each step says what it installs before it starts, and pip shows each download and then, at a terminal, a bar of
# the packages it unpacks (pip 25.1 and newer: the venv's own pip 23 printed nothing in that phase, 85 s of silence
# for the extras); benchmarks/first_hour.py measures the longest silence
EXTRAS := train,trackers,plot,test,aws,k8s,lint,docs
# a line whenever a step's output stands still for 10 s (pip unpacking torch's one big wheel shows nothing moving)
BEAT := python3 scripts/heartbeat 10
# pytest prints a dot per test, a line per 72: a slow test holds the line for minutes (a CI log looks hung)
TESTBEAT := python3 scripts/heartbeat 30
$(STAMP): pyproject.toml
	@echo "installing into $(VENV): about 3-6 minutes and 2.2 GB on disk (torch 2.13 CPU ~0.75 GB, transformers," \
		"datasets, the test, lint and docs tools); pip shows each download"
	@echo "== 1/4: a virtual environment in $(VENV) (python3 -m venv) =="
	$(BEAT) "making the venv" -- python3 -m venv $(VENV)
	@echo "== 2/4: pip 26.3 in it (its progress bar covers unpacking too) =="
	$(BEAT) "installing pip" -- $(PY) -m pip install --progress-bar on pip==26.3
	@echo "== 3/4: torch 2.13.0, the CPU build (~0.75 GB; a bare \`torch\` would pull a multi-GB CUDA build) =="
	$(BEAT) "installing torch" -- $(PY) -m pip install --progress-bar on torch==2.13.0
	@echo "== 4/4: fsdpctl and its extras ($(EXTRAS)): transformers, datasets, TensorBoard, W&B," \
		"matplotlib, boto3, the Kubernetes client, pytest, moto, ruff, mypy, MkDocs, ... (about 150 packages) =="
	$(BEAT) "installing fsdpctl and its extras" -- $(PY) -m pip install --progress-bar on -e '.[$(EXTRAS)]'
	touch $@
	@echo "installed: $(VENV)/bin/fsdpctl (put it on PATH with: . $(VENV)/bin/activate)"

install: $(STAMP)

# fsdpctl lives in .venv/bin, which make cannot put on the caller's PATH: say how, after the run (also when it
# failed, with the run's exit code)
quickstart: install
	@$(VENV)/bin/fsdpctl quickstart; code=$$?; echo; \
	echo "fsdpctl is in $(VENV)/bin, not on your PATH: run \`. $(VENV)/bin/activate\` once in this shell to type" \
		"\`fsdpctl ...\` as the hints above do, or call it as $(VENV)/bin/fsdpctl"; exit $$code

$(CHECKOV):
	@echo "== checkov 3.3.30 for the security tests, in a venv of its own (.venv-checkov: its pins clash" \
		"with boto3's): about 1-2 minutes, pip shows each package =="
	$(BEAT) "making checkov's venv" -- python3 -m venv .venv-checkov
	$(BEAT) "installing pip" -- .venv-checkov/bin/python -m pip install --progress-bar on pip==26.3
	$(BEAT) "installing checkov" -- .venv-checkov/bin/python -m pip install --progress-bar on checkov==3.3.30

# the fast tests on 2 workers as in test-fast, then the slow ones in two processes at once: the multi-process
# runs one at a time, and beside them the ones that wait on docker, terraform or endpoints (tests/conftest.py
# SLOW_BESIDE), whose report follows; it fails if either fails. CI's budget leaves out the slow tests marked
# `extended` (tests/conftest.py EXTENDED, the conformance cells not in CI_CELLS): `make test-all` runs them too
SCOPE ?= not extended
test: install $(CHECKOV)
	scripts/system-deps
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not slow"
	@beside=$$(mktemp); \
	$(PY) -m pytest -q -p no:cacheprovider -m "slow and beside and $(SCOPE)" >$$beside 2>&1 & pid=$$!; \
	$(TESTBEAT) "the slow tests (one at a time)" -- $(PY) -m pytest -q --durations=40 -m "slow and not beside and $(SCOPE)"; serial=$$?; \
	wait $$pid; besides=$$?; echo "== the slow tests run beside (exit $$besides) =="; cat $$beside; rm -f $$beside; \
	test $$serial = 0 && test $$besides = 0

# everything CI runs and the slow tests it leaves out (about twice as long)
test-all:
	$(MAKE) test SCOPE="(extended or not extended)"

# the conformance suite alone, every cell on every backend (tests/conformance; about 40 minutes here)
conformance: install
	scripts/system-deps
	$(PY) -m pytest -q -p no:cacheprovider tests/conformance

# everything but the tests marked slow (multi-process runs, real terraform, checkov, docker): settings,
# manifests, plan, CLI and goldens, Kubernetes and AWS peers; 2 workers on 2 cores (under 2 minutes; 4
# workers, once faster while the Kubernetes peer tests mostly waited, took 125 s against 106-120 s)
test-fast: install
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not slow"

# rewrite every golden file (--help of each command, main outputs, manifests) after an intended change;
# review `git diff tests/golden` before committing
golden: install
	FSDPCTL_UPDATE_GOLDEN=1 $(PY) -m pytest -q -p no:cacheprovider tests -m "not slow" -k golden

# the CLI fuzzer with a longer budget than CI's (FSDPCTL_TEST_FUZZ_EXAMPLES cases, default 5000, about 20 minutes on
# 2 cores): every case runs, and every distinct failure is listed at the end (FSDPCTL_TEST_FUZZ_COLLECT)
FUZZ_EXAMPLES ?= 5000
fuzz: install
	FSDPCTL_TEST_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FSDPCTL_TEST_FUZZ_COLLECT=1 $(PY) -m pytest -q -s -p no:cacheprovider \
		tests/test_fuzz.py -k test_fuzz_cli

# layering contracts, lint, format, types, and the docs site built strictly (a broken link fails)
lint: install
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	site=$$(mktemp -d); NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir $$site; \
		code=$$?; rm -rf $$site; exit $$code

# the docs site (mkdocs.yml, docs/) into site/, strictly: open site/index.html
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: install
	$(PY) benchmarks/run.py
