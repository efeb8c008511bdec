# memfrac — two set-up commands do everything on a fresh machine with python3 and make:
#   make run    the main job: sweep the bundled default scenarios (measures on CUDA; honest fallback without)
#   make test   create/update .venv, install memfrac with its extras, run the whole suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.memfrac-installed
RELEASES := .cache/sglang-releases
# Older sglang releases the conformance tests check the per-release rule sets against (installed
# without dependencies into their own directories, ahead of the 0.5.23 install on PYTHONPATH): one per
# rule-set group from 0.4.0 to 0.5.11 (tests/engine/test_conformance.py REPRESENTATIVES), every release from 0.5.12.
OLD_RELEASES := 0.4.0 0.4.1 0.4.5 0.4.6 0.4.6.post4 0.4.6.post5 0.4.7 0.4.8 0.4.9 0.4.10 0.5.2 0.5.3 0.5.4 \
	0.5.5 0.5.6 0.5.7 0.5.8.post1 0.5.9 0.5.10 0.5.11 \
	0.5.12 0.5.13 0.5.14 0.5.15.post1 0.5.16 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22
OUT ?= results/default

.PHONY: run test bench lint install old-releases system-deps clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[sglang,dev,ray]' $$(bash scripts/transfer-package.sh)
	@touch $@

system-deps:
	@bash scripts/system-deps.sh

old-releases: $(STAMP) $(addprefix $(RELEASES)/,$(addsuffix /.installed,$(OLD_RELEASES)))

$(RELEASES)/%/.installed:
	bash scripts/install-release.sh $* $(RELEASES)/$*
	@touch $@

test: $(STAMP) system-deps old-releases
	$(PY) -m pytest

run: $(STAMP) system-deps
	$(VENV)/bin/memfrac sweep scenarios/default.toml --out $(OUT)

bench: $(STAMP)
	$(PY) bench/bench_heuristic.py
	$(PY) bench/bench_ingest.py
	$(PY) bench/bench_probe.py
	$(PY) bench/bench_audit.py

lint: $(STAMP)
	$(VENV)/bin/ruff check profiler tests bench

clean:
	rm -rf $(VENV) .cache .pytest_cache
