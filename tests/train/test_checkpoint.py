"""Checkpoints in one process: exact round trip on a mesh, keep-last-N, corrupt steps, config check,
the metrics cursor and the stop-on-signal handler. The resume of real runs is in test_resume.py."""

import glob
import json
import logging
import os
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import checkpoint, configs, train
from gdro_jax.train._preemption import stop_on_signals
from tests.train import _resume_config


def _config(**mesh):
    config = _resume_config.get_config()
    config.grpo.kl_coef = 0.0  # ref_params None here; the resume runs cover a reference
    config.method = "gdro_both"
    config.mesh.update(mesh)
    return config


def _advanced(state, seed):
    """`state` with every leaf changed (same shapes, dtypes, shardings) and `step` = 3."""
    rng = np.random.default_rng(seed)

    def change(leaf):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = rng.integers(0, 2**32, jax.random.key_data(leaf).shape, np.uint32)
            return jax.random.wrap_key_data(
                jax.device_put(data, leaf.sharding), impl=jax.random.key_impl(leaf)
            )
        if leaf.dtype == jnp.bool_:
            value = rng.random(leaf.shape) < 0.5
        elif jnp.issubdtype(leaf.dtype, jnp.integer):
            value = rng.integers(0, 100, leaf.shape)
        else:
            value = rng.standard_normal(leaf.shape)
        return jax.device_put(np.asarray(value, leaf.dtype), leaf.sharding)

    new = jax.tree.map(change, state)
    return new._replace(step=jax.device_put(np.int32(3), state.step.sharding))


def _host(tree):
    def leaf(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)

    return jax.tree.map(leaf, tree)


@pytest.fixture(scope="module")
def mesh_run():
    """A gdro_both run on a 2x2x2 mesh (nothing compiled but its initialisation)."""
    run = train.build_run(_config(data=2, fsdp=2, tensor=2))
    yield run
    run.close()


def _save(manager, state, run, metrics_bytes):
    """Saves `state` as a run saves its checkpoints: with the prompt iterator and the meta."""
    meta = {"config": configs.config_dict(run.config), "metrics_bytes": metrics_bytes}
    return checkpoint.save_checkpoint(
        manager, int(state.step), state, data_iterator=run.prompt_batches, meta=meta
    )


def _save_steps(run, directory, steps, *, keep=3, seed=0):
    """Saves `steps` checkpoints of distinct states; returns them by step."""
    manager = checkpoint.checkpoint_manager(directory, keep=keep)
    saved = {}
    for step in steps:
        state = _advanced(run.state, seed + step)._replace(
            step=jax.device_put(jnp.int32(step), run.state.step.sharding)
        )
        saved[step] = (_host(state), run.prompt_batches.get_state())
        _save(manager, state, run, 0)
        next(run.prompt_batches)
    return manager, saved


def test_round_trip_is_exact_and_placed_like_a_fresh_state(mesh_run, tmp_path):
    run = mesh_run
    for _ in range(3):
        next(run.prompt_batches)
    state = _advanced(run.state, seed=7)
    manager = checkpoint.checkpoint_manager(tmp_path / "checkpoints", keep=2)
    path = _save(manager, state, run, 123)
    following = [np.asarray(next(run.prompt_batches)) for _ in range(2)]
    assert path == str(tmp_path / "checkpoints" / "3")

    template = checkpoint.abstract_state(run.state)
    restored = checkpoint.restore_checkpoint(
        checkpoint.checkpoint_manager(tmp_path / "checkpoints", keep=2),
        template,
        run.prompt_batches,
    )
    assert restored.step == 3 and restored.path == path
    assert restored.meta["metrics_bytes"] == 123
    assert restored.meta["config"] == configs.config_dict(run.config)
    got, want = jax.tree_util.tree_flatten(restored.state), jax.tree_util.tree_flatten(state)
    assert got[1] == want[1], "same pytree structure"
    for a, b, fresh in zip(got[0], want[0], jax.tree.leaves(run.state), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(_host(a), _host(b))
        assert a.sharding == fresh.sharding
    assert any(len(x.sharding.device_set) == 8 for x in jax.tree.leaves(restored.state.params))
    assert jax.dtypes.issubdtype(restored.state.key.dtype, jax.dtypes.prng_key)
    for batch in following:
        np.testing.assert_array_equal(np.asarray(next(run.prompt_batches)), batch)


@pytest.fixture(scope="module")
def written(mesh_run, tmp_path_factory):
    """Checkpoints of steps 2, 3, 4 saved with keep=2, and each step's host state and position."""
    directory = tmp_path_factory.mktemp("written") / "checkpoints"
    _, saved = _save_steps(mesh_run, directory, [2, 3, 4], keep=2)
    return directory, saved


def _copy(written, tmp_path):
    """A copy of the written checkpoints. Tensorstore caches what this process wrote, so damage
    done to the written folder itself would not be seen; a resumed run is a new process."""
    directory = tmp_path / "checkpoints"
    shutil.copytree(written[0], directory)
    return directory


def _restore(mesh_run, directory):
    return checkpoint.restore_checkpoint(
        checkpoint.checkpoint_manager(directory, keep=2),
        checkpoint.abstract_state(mesh_run.state),
        mesh_run.prompt_batches,
    )


def test_keeps_the_last_n(written):
    assert sorted(os.listdir(written[0])) == ["3", "4"]


def _truncate(step_dir):
    for path in glob.glob(f"{step_dir}/state/**/d/*", recursive=True):
        os.truncate(path, os.path.getsize(path) // 2)


def _garble(step_dir):
    """Flips 64 bytes in the middle of every data file of the state (values and b-tree nodes)."""
    for path in glob.glob(f"{step_dir}/state/**/d/*", recursive=True):
        data = bytearray(open(path, "rb").read())
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(b ^ 0x5A for b in data[middle : middle + 64])
        open(path, "wb").write(bytes(data))


def _wrong_checksum(step_dir):
    """A leaf whose bytes no longer match its checksum (what a garbled raw chunk reads as)."""
    path = f"{step_dir}/meta/metadata"
    meta = json.loads(open(path).read())
    name = next(n for n in meta["checksums"] if n.startswith("params/"))
    meta["checksums"][name][1] ^= 1
    open(path, "w").write(json.dumps(meta))


def _no_meta(step_dir):
    os.remove(f"{step_dir}/meta/metadata")


def _garbled_data_position(step_dir):
    (path,) = glob.glob(f"{step_dir}/data/*.json")
    open(path, "w").write('{"next_index": ')


CORRUPTIONS = {
    "truncated": _truncate,
    "garbled": _garble,
    "checksum": _wrong_checksum,
    "no_meta": _no_meta,
    "data_position": _garbled_data_position,
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupt_latest_checkpoint_is_named_and_the_previous_one_restored(
    mesh_run, written, tmp_path, caplog, corruption
):
    directory = _copy(written, tmp_path)
    CORRUPTIONS[corruption](directory / "4")
    with caplog.at_level(logging.WARNING):
        restored = _restore(mesh_run, directory)
    assert restored.step == 3
    host_state, position = written[1][3]
    for a, b in zip(
        jax.tree.leaves(_host(restored.state)), jax.tree.leaves(host_state), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    assert mesh_run.prompt_batches.get_state() == position
    warning = f"checkpoint {directory / '4'} cannot be restored"
    assert any(warning in r.getMessage() for r in caplog.records), caplog.text
    # Set aside (kept, not deleted), so that the resumed run can save step 4 again.
    assert sorted(os.listdir(directory)) == ["3"]
    assert os.path.isdir(tmp_path / checkpoint.CORRUPT_DIR / "4")


def test_after_a_fallback_the_step_is_saved_again(mesh_run, written, tmp_path):
    directory = _copy(written, tmp_path)
    _truncate(directory / "4")
    restored = _restore(mesh_run, directory)
    manager = checkpoint.checkpoint_manager(directory, keep=2)
    state = restored.state._replace(step=restored.state.step + 1)
    _save(manager, state, mesh_run, 0)
    assert list(manager.all_steps()) == [3, 4]
    assert _restore(mesh_run, _copy((directory, None), tmp_path / "again")).step == 4


def test_no_usable_checkpoint_is_an_error_naming_each_and_moves_nothing(
    mesh_run, written, tmp_path
):
    directory = _copy(written, tmp_path)
    _truncate(directory / "4")
    _no_meta(directory / "3")
    before = sorted(glob.glob(f"{tmp_path}/**", recursive=True))
    with pytest.raises(train.CheckpointError) as error:
        _restore(mesh_run, directory)
    assert str(directory / "4") in str(error.value) and str(directory / "3") in str(error.value)
    assert sorted(glob.glob(f"{tmp_path}/**", recursive=True)) == before


def test_a_config_that_changes_the_run_is_refused_by_name():
    config = _config()
    saved = configs.config_dict(config)
    resumable = _config()
    resumable.steps = 100
    resumable.progress = True
    resumable.checkpoint.every_steps = 7
    configs.check_resumable(saved, resumable, "ckpt/4")
    changed = _config()
    changed.optimizer.learning_rate = 0.5
    changed.method = "grpo"
    with pytest.raises(ValueError, match="ckpt/4") as error:
        configs.check_resumable(saved, changed, "ckpt/4")
    assert "optimizer.learning_rate: saved 0.01, now 0.5" in str(error.value)
    assert "method: saved 'gdro_both', now 'grpo'" in str(error.value)
    assert "steps" not in str(error.value).split("Differing fields:")[1].split(". Use")[0]


def _rows(steps):
    return [(json.dumps({"step": s, "reward": s / 10}) + "\n").encode() for s in steps]


def test_rewind_keeps_the_rows_up_to_the_cursor_byte_for_byte(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = _rows(range(1, 7))
    path.write_bytes(b"".join(rows))
    cursor = len(b"".join(rows[:4]))
    assert train.rewind_metrics(path, 4, cursor) == 2
    assert path.read_bytes() == b"".join(rows[:4])
    assert train.rewind_metrics(path, 4, cursor) == 0


def test_rewind_without_a_matching_cursor_keeps_rows_up_to_the_step(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    rows = _rows(range(1, 7))
    path.write_bytes(b"".join(rows))
    with caplog.at_level(logging.WARNING):
        assert train.rewind_metrics(path, 3, 5) == 3
    assert path.read_bytes() == b"".join(rows[:3])
    assert "does not match the checkpoint's cursor" in caplog.text


def test_the_first_stop_signal_is_a_request_and_the_second_interrupts():
    previous = signal.getsignal(signal.SIGTERM)
    with stop_on_signals() as stop:
        assert stop.signum is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_signal_after_the_steps_check_stops_the_run_after_the_step_its_notice_names(capfd):
    # The race CI met: Ctrl-C lands after step 4's check, before step 5 begins. The notice must
    # name step 5, and the loop must stop after step 5, not 4.
    with stop_on_signals() as stop:
        stop.steps = 10
        stop.step = 4
        assert stop.poll() is None  # step 4's check: no signal yet
        os.kill(os.getpid(), signal.SIGTERM)
        assert "SIGTERM received: finishing step 5 " in capfd.readouterr().err
        assert stop.poll() is None  # still step 4: the run goes on
        stop.step = 5
        assert stop.poll() == signal.SIGTERM
    # Before the check, the step in flight is the one named and the one stopped after.
    with stop_on_signals() as stop:
        stop.steps, stop.step = 10, 4
        os.kill(os.getpid(), signal.SIGTERM)
        assert "SIGTERM received: finishing step 4 " in capfd.readouterr().err
        assert stop.poll() == signal.SIGTERM
    # After the last step's check the run ends as it would have.
    with stop_on_signals() as stop:
        stop.steps = stop.step = 10
        assert stop.poll() is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert "SIGTERM received: finishing the run " in capfd.readouterr().err


def test_checkpoint_options_are_validated():
    config = _config()
    settings = configs.read_run_config(config).checkpoint
    assert settings == configs.CheckpointSettings(enabled=True, every_steps=1, keep=2)
    config.checkpoint.keep = 0
    with pytest.raises(ValueError, match="config.checkpoint.keep must be an int >= 1.*keep=0"):
        configs.read_run_config(config)
    config.checkpoint.keep = 2
    config.checkpoint.every_steps = 0
    with pytest.raises(ValueError, match="every_steps=0"):
        configs.read_run_config(config)
