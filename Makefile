# Two entry points for a fresh machine: `make quickstart` (train) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install quickstart test bench

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU wheel of torch first: a bare `torch` would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[train,test]'
	touch $@

install: $(STAMP)

quickstart: install
	$(PY) -m fsdptrain.assets .fsdpctl/assets
	$(VENV)/bin/torchrun --standalone --nproc-per-node 2 -m fsdptrain --model tiny \
	  --dataset .fsdpctl/assets/corpus.txt --tokenizer .fsdpctl/assets/tokenizer --checkpoint-dir .fsdpctl/checkpoints

test: install
	scripts/system-deps
	$(PY) -m pytest -q

bench: install
	$(PY) benchmarks/run.py
