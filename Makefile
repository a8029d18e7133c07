# `make demo`: set up .venv and run the embedded demo end to end on CPU, offline.
# `make test`: set up .venv if needed and run the whole test suite (what CI runs), in two
#   pytest-xdist workers; a test module stays in one worker (its module fixtures load once), the
#   longest modules start first (tests/conftest.py's LONGEST_FIRST).
#   PYTEST_WORKERS=0 runs it in one process. Both test targets end with the ten slowest test
#   modules (scripts/pytest-table.sh: pytest's --durations=0 summed by scripts/module_durations.py)
#   and exit with pytest's status.
# `make test-threads`: the `numeric` tests again, computed as a smaller machine would (one thread,
#   CPU kernels one instruction set down: tests/numeric.py's other_machine_env); CI runs it too.
# `make lint`: scripts/lint.sh (ruff, ruff format --check, snakefmt, snakemake --lint, dry runs).
VENV ?= .venv
PY := $(VENV)/bin/python
PROFILE ?= profiles/local
PYTEST_WORKERS ?= 2
PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: demo test test-fast test-threads lint setup dag docs/dag.png clean

setup: $(VENV)/.installed

# What the demo needs: the system packages and .venv ($$SETUP_PARTS overrides: CI sets `venv`).
$(VENV)/.installed: pyproject.toml scripts/setup-env.sh
	SETUP_PARTS="$${SETUP_PARTS:-system venv}" bash scripts/setup-env.sh

# What only tests use besides: the MLflow server's, verl's and DeepSpeed's environments (GBs that
# `make demo` need not fetch; each optional: its tests skip, saying so, when it did not install).
$(VENV)/.test-installed: $(VENV)/.installed scripts/setup-env.sh
	SETUP_PARTS="mlflow verl deepspeed" bash scripts/setup-env.sh
	touch $@

demo: setup
	$(PY) -m ckpteval.demo build --out resources/demo
	$(VENV)/bin/snakemake --profile $(PROFILE)
	@echo "demo: results in results/summary/ (metrics.md, report.html)"

test: $(VENV)/.test-installed
	bash scripts/pytest-table.sh $(PY) $(PARALLEL)

test-fast: $(VENV)/.test-installed
	bash scripts/pytest-table.sh $(PY) $(PARALLEL) -m "not slow"

test-threads: setup
	env $$(cd tests && $(abspath $(PY)) -c 'from numeric import other_machine_env as e; print(*(f"{k}={v}" for k, v in e().items()))') \
		$(PY) -m pytest -m "numeric and not slow"

lint: setup
	bash scripts/lint.sh

dag: setup
	@command -v dot >/dev/null || { echo "dag: graphviz's dot not found; install it with: sudo apt-get install graphviz" >&2; exit 1; }
	$(VENV)/bin/snakemake --rulegraph | dot -Tsvg > rulegraph.svg
	@echo "wrote rulegraph.svg"

# The README's picture of one checkpoint's DAG, from the current workflow (scripts/dag_png.py).
docs/dag.png: setup
	$(PY) scripts/dag_png.py

clean:
	rm -rf results logs .snakemake
