# `make demo`: set up .venv and run the embedded demo end to end on CPU, offline.
# `make test`: set up .venv if needed and run the whole test suite (what CI runs).
VENV ?= .venv
PY := $(VENV)/bin/python
PROFILE ?= profiles/local

.PHONY: demo test test-fast setup dag clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/setup-env.sh
	bash scripts/setup-env.sh

demo: setup
	$(PY) -m ckpteval.demo build --out resources/demo
	$(VENV)/bin/snakemake --profile $(PROFILE)
	@echo "demo: results in results/summary/ (metrics.md, report.html)"

test: setup
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not slow"

dag: setup
	$(VENV)/bin/snakemake --rulegraph | dot -Tsvg > rulegraph.svg
	@echo "wrote rulegraph.svg"

clean:
	rm -rf results logs .snakemake
