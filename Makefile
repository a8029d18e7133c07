# `make demo`: set up .venv and run the embedded demo end to end on CPU, offline.
# `make test`: set up .venv if needed and run the whole test suite (what CI runs).
# `make test-threads`: the `numeric` tests again, computed as a smaller machine would (one thread,
#   CPU kernels one instruction set down: tests/numeric.py's other_machine_env); CI runs it too.
# `make lint`: scripts/lint.sh (ruff, ruff format --check, snakefmt, snakemake --lint, dry runs).
VENV ?= .venv
PY := $(VENV)/bin/python
PROFILE ?= profiles/local

.PHONY: demo test test-fast test-threads lint setup dag clean

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

test-threads: setup
	env $$(cd tests && $(abspath $(PY)) -c 'from numeric import other_machine_env as e; print(*(f"{k}={v}" for k, v in e().items()))') \
		$(PY) -m pytest -m "numeric and not slow"

lint: setup
	bash scripts/lint.sh

dag: setup
	$(VENV)/bin/snakemake --rulegraph | dot -Tsvg > rulegraph.svg
	@echo "wrote rulegraph.svg"

clean:
	rm -rf results logs .snakemake
