# Set-up and entry points. `make demo` and `make test` each create .venv if it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo sim test lint format bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

# The miniature study: warm start (reused when present), RL per method, held-out table, plots.
demo: $(STAMP)
	$(PY) -m experiments.demo --config=experiments/configs/demo.py --workdir=runs/demo

# The controller-dynamics simulation (about 20 s).
sim: $(STAMP)
	$(PY) -m experiments.simulate_controllers --config=experiments/configs/sim_default.py --workdir=runs/sim_demo

test: $(STAMP)
	$(PY) -m pytest -q tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	$(PY) -m benchmarks.controllers

clean:
	rm -rf runs .pytest_cache
