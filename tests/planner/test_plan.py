"""The memory plan: persistent bytes equal a hand count, the KV cache line equals its formula, a run
over `device_memory_gib` is refused before any parameter exists, and `experiments/plan.py` exits
0 or 1 by the budget.

One plan of a one-layer policy on a 1 x 4 x 1 mesh (two compiles) serves the first tests.
"""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from gdro_jax import configs, models, planner, tasks, train
from gdro_jax.train import _run
from tests.train.configs import tiny_config

REPO_ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3
FSDP = 4
# R = 8 slots decoded 4 at a time, mini-batches of 4; an untied head and a KL reference, so
# every line of the plan is there.
SMALL = {
    "num_prompts": 4,
    "n_mean": 2,
    "max_new_tokens": 8,
    "model.num_layers": 1,
    "model.tie_embeddings": False,
    "model.compute_dtype": "bfloat16",
    "grpo.kl_coef": 0.01,
    "rollout.micro_batch_slots": 4,
    "mesh.fsdp": FSDP,
}


def small_config(**overrides):
    return tiny_config(**{**SMALL, **overrides})


@pytest.fixture(scope="module")
def plan():
    config = small_config()
    return planner.memory_plan(config, configs.run_mesh(configs.read_run_config(config)))


def hand_parameter_bytes(model, shards: int) -> int:
    """Float32 bytes per device of a Qwen3 decoder: every matrix has its D axis on `fsdp`, the
    norm scales are replicated."""
    V, D, L = model.vocab_size, model.d_model, model.num_layers
    N, K, H, F = model.num_heads, model.num_kv_heads, model.head_dim, model.mlp_dim
    embeddings = V * D * (1 if model.tie_embeddings else 2)  # the table, and an untied head
    per_layer = D * N * H + 2 * D * K * H + N * H * D + 3 * D * F  # q, k and v, o, gate/up/down
    sharded = embeddings + L * per_layer
    replicated = D + L * (2 * D + 2 * H)  # final norm; attention and MLP norms, q and k norms
    assert sharded % shards == 0
    return 4 * (sharded // shards + replicated)


def test_persistent_lines_equal_a_hand_count_over_the_shards(plan):
    config = small_config()
    expected = hand_parameter_bytes(config.model, FSDP)
    assert plan.parameters == expected
    assert plan.optimizer == 2 * expected + 4  # AdamW's mu and nu, and its int32 step count
    assert plan.reference == expected  # kl_coef > 0: the frozen copy


@pytest.fixture(scope="module")
def built():
    run = train.build_run(small_config())
    run.close()
    return run


def _held_per_device(tree) -> int:
    """Bytes device 0 holds of every leaf of `tree` (its shards are even, or replicated)."""
    return sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(tree))


def test_persistent_lines_equal_what_build_run_holds_per_device(plan, built):
    assert _held_per_device(built.state.params) == plan.parameters
    assert _held_per_device(built.state.ref_params) == plan.reference


def test_optimizer_line_equals_what_build_run_holds_per_device(plan, built):
    assert _held_per_device(built.state.opt_state) == plan.optimizer


def test_kv_cache_line_equals_its_formula_for_the_rollout_micro_batch(plan):
    config = small_config()
    model = config.model
    prompt_width = tasks.ChainTaskConfig(**config.task.to_dict()).max_prompt_length
    slots = config.rollout.micro_batch_slots
    bfloat16_bytes = 2
    expected = (
        2  # keys and values
        * model.num_layers
        * model.num_kv_heads
        * model.head_dim
        * slots
        * (prompt_width + config.max_new_tokens)
        * bfloat16_bytes
        // FSDP  # the slots on the batch axes
    )
    assert plan.rollout_slots == slots
    assert plan.kv_cache == expected
    assert plan.update > 0 and plan.rollout_other > 0  # both phases were compiled


def test_the_knob_named_is_the_one_of_the_biggest_line(plan):
    assert plan.fits and plan.knobs() == ()
    phases = {
        "rollout.micro_batch_slots": plan.rollout_phase,
        "grpo.micro_batch_slots": plan.update,
    }
    larger = max(phases, key=phases.get)
    between = plan.persistent + (min(phases.values()) + max(phases.values())) // 2
    assert plan._replace(budget=between).knobs() == (larger,)
    assert plan._replace(budget=plan.persistent - 1).knobs() == ("mesh.fsdp",)


def test_a_run_over_its_budget_is_refused_before_any_parameter_exists(tmp_path, monkeypatch):
    config = small_config()
    # Half the parameters alone: nothing needs compiling to say no.
    config.device_memory_gib = hand_parameter_bytes(config.model, FSDP) / 2 / GIB

    def allocate(*args, **kwargs):
        raise AssertionError("the policy was allocated before the memory plan refused the run")

    monkeypatch.setattr(_run, "load_policy", allocate)
    embedding = (config.model.vocab_size, config.model.d_model)
    before = {id(array) for array in jax.live_arrays()}
    workdir = tmp_path / "run"
    with pytest.raises(ValueError) as refused:
        train.train(config, workdir)
    message = str(refused.value)
    assert "raise config.mesh.fsdp" in message
    assert "parameters (float32 masters)" in message and "rollout KV cache" in message  # table
    new = [a for a in jax.live_arrays() if id(a) not in before]
    assert not any(a.shape == embedding and a.dtype == jnp.float32 for a in new)
    assert [files for _, _, files in os.walk(workdir) if files] == []


def _plan_command(tmp_path, budget_gib):
    # Exactly the 1 x 2 x 1 mesh asked for, so the command must make its own fake devices.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    # Both calls compile the same programs: the second reads them from this cache.
    env.update(
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=str(tmp_path / "compile_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    overrides = dict(
        num_prompts=4,
        n_mean=2,
        max_new_tokens=8,
        **{
            "model.num_layers": 1,
            "model.d_model": 32,
            "model.num_heads": 2,
            "model.num_kv_heads": 1,
            "model.head_dim": 16,
            "model.mlp_dim": 64,
            "mesh.fsdp": 2,
            "device_memory_gib": budget_gib,
        },
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.plan",
            "--config=experiments/configs/tiny_cpu.py",
            *(f"--config.{name}={value}" for name, value in overrides.items()),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_plan_command_exits_0_within_the_budget_and_1_over_it(tmp_path):
    fits = _plan_command(tmp_path, 1.0)
    assert fits.returncode == 0, fits.stderr[-2000:]
    assert "2 devices, compiled on fake CPU devices" in fits.stdout
    assert "fits" in fits.stdout and "largest micro-batches that fit" in fits.stdout
    assert fits.stdout.rstrip().splitlines()[-1].startswith("Nothing written: ")

    over = _plan_command(tmp_path, 1e-6)
    assert over.returncode == 1, over.stderr[-2000:]
    assert "does not fit" in over.stdout and "Traceback" not in over.stderr
    errors = [line for line in over.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: ")
    assert "raise config.mesh.fsdp" in errors[0]  # the parameters alone exceed 1 KiB


def test_a_config_mesh_unlike_the_mesh_is_refused():
    config = small_config()
    with pytest.raises(ValueError, match="config.mesh"):
        planner.memory_plan(config, models.make_mesh(1, 2, 1))


def test_each_size_prints_in_the_unit_that_fits_it():
    """Written out by hand: three significant digits in B, KiB, MiB, GiB or TiB."""
    assert planner.format_size(0) == "0 B"
    assert planner.format_size(812) == "812 B"
    assert planner.format_size(1023) == "1023 B"
    assert planner.format_size(1024) == "1.00 KiB"
    assert planner.format_size(1023 * 1024) == "1023 KiB"
    assert planner.format_size(int(3.02 * 1024**2)) == "3.02 MiB"
    assert planner.format_size(int(45.6 * 1024**3)) == "45.6 GiB"
    assert planner.format_size(3 * 1024**4) == "3.00 TiB"
    assert planner.format_size(5000 * 1024**4) == "5000 TiB"


def test_the_update_line_names_its_packed_rows_and_their_tokens(plan):
    """The small run packs (the default): R = 8 slots in 2 mini-batches of 4, P + M = 19 + 8
    tokens a row, an eighth of a mini-batch's slots (at least 1) a pass."""
    assert plan.update_slots == 1
    assert "update temporaries (compiled, 1 packed row of 27 tokens per pass)" in plan.table()
    assert "grpo.pack_sequences: each mini-batch's sequences packed into rows of 27" in plan.table()


def test_a_math_run_is_planned_without_a_tokenizer():
    """A memory plan needs shapes only: a math config whose `tokenizer` and `init_from` are
    empty (as the paper presets ship) is planned at its `max_prompt_tokens`, packed rows
    included; training it still refuses, naming the field."""
    config = small_config(**{"task_kind": "math", "math.max_prompt_tokens": 12, "mesh.fsdp": 1})
    assert not config.tokenizer and not config.init_from
    table = planner.memory_plan(config).table()
    assert "packed row of 20 tokens per pass" in table, table
    with pytest.raises(ValueError, match="the math task needs a tokenizer"):
        configs.read_run_config(config)


@pytest.fixture(scope="module")
def remat_bytes():
    """(config, mesh, persistent bytes, the update's bytes with "dots", with "nothing") of a
    remat config whose mini-batches of 4 slots on 4 batch shards leave no smaller micro-batch
    to try."""
    config = small_config(**{"model.remat": True, "grpo.micro_batch_slots": 4})
    settings = configs.read_run_config(config)
    mesh = configs.run_mesh(settings)
    probe = planner.Planner(settings, mesh, None, None)
    assert probe.candidates(probe.minibatch_slots) == [4]
    dots, nothing = probe.update_bytes(4, (True, "dots")), probe.update_bytes(4)
    reference = probe.parameter_bytes if probe.reference else 0
    persistent = probe.parameter_bytes + reference + planner.bytes_per_device(probe.opt_state)
    return config, mesh, persistent, dots, nothing


def test_a_remat_policy_over_the_budget_is_advised_down_to_the_full_remat(remat_bytes):
    """With `model.remat_policy="dots"` the update keeps its projections' outputs: XLA's buffer
    assignment holds more than with "nothing". With a budget between the two the search falls
    back to the full remat and says the one setting that differs from the config's."""
    config, mesh, persistent, dots, nothing = remat_bytes
    assert dots > nothing
    config = config.copy_and_resolve_references()
    config.model.remat_policy = "dots"
    config.device_memory_gib = (persistent + (dots + nothing) / 2) / GIB
    plan = planner.memory_plan(config, mesh, suggest=True)
    assert plan.update == dots and not plan.fits
    assert plan.fitting_update_slots == 4 and plan.fitting_needs_remat
    assert plan.dots_update is None  # "dots" is what did not fit
    suggestion = [line for line in plan.table().splitlines() if "largest micro-batches" in line]
    assert suggestion[0].endswith(
        "--config.model.remat_policy=nothing --config.grpo.micro_batch_slots=4"
    )
    assert "model.remat=True" not in suggestion[0]  # the config has it already
    if "grpo.micro_batch_slots" in plan.knobs():
        assert "or set config.model.remat_policy=nothing" in plan.error()


def test_where_memory_allows_the_search_offers_dots(remat_bytes):
    """A config that keeps nothing, with room for "dots" at the micro-batch that fits: the plan
    says so, with the bytes XLA assigned it."""
    config, mesh, persistent, dots, _ = remat_bytes
    config = config.copy_and_resolve_references()
    config.device_memory_gib = (persistent + dots + 1) / GIB
    plan = planner.memory_plan(config, mesh, suggest=True)
    assert plan.fitting_update_slots == 4 and not plan.fitting_needs_remat
    assert plan.dots_update == dots
    offer = [line for line in plan.table().splitlines() if "also fits" in line]
    assert offer == [
        f"  that update also fits with --config.model.remat_policy=dots "
        f"({planner.format_size(dots)}): its blocks keep their projections' outputs, so the "
        "backward pass does not redo those matmuls"
    ]
