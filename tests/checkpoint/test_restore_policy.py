"""A training run's policy, opened from its checkpoint alone (`checkpoint.restore_policy`, which
`eval.open_policy` uses): never the trainer, never the run's `init_from`, on one device whatever
mesh the run trained on, with the greedy completions of the policy opened on that mesh.

A run of 2 steps trains here from a stand-in warm start (a random policy saved as an HF folder)
on a 2 x 2 x 2 mesh, so every parameter axis the mesh shards (data, fsdp, tensor) is split; the
warm-start folder is deleted afterwards, so a read of it would fail. A process with one device then
opens the run and decodes greedily.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from gdro_jax import checkpoint, models, sampling, tasks, train
from tests._subprocesses import xla_flags
from tests.train.configs import small_run_config

ROOT = Path(__file__).resolve().parents[2]
# One mesh (a 1 x 2 x 1 one ran here too, and took a third of the module's time): 2 x 2 x 2 shards
# along every axis a smaller mesh would.
MESHES = {"mesh8": dict(data=2, fsdp=2, tensor=2)}
NEW_TOKENS = 12

# In a child process with one device: open the run as `experiments.evaluate` does, decode the
# prompts greedily, and report what the process loaded and started.
_OPEN = r"""
import json, subprocess, sys

started = []  # every process started while opening (a grader's workers may be gone by the end)
_start = subprocess.Popen.__init__


def recording(self, *args, **kwargs):
    started.append(str(args[0] if args else kwargs.get("args")))
    _start(self, *args, **kwargs)


subprocess.Popen.__init__ = recording
import jax, numpy as np
from flax import nnx
from gdro_jax import eval as evaluation, sampling

path, prompts = sys.argv[1], json.loads(sys.argv[2])
policy = evaluation.open_policy(path)
opened_with = list(started)
result = sampling.generate(
    policy.model, prompts, key=jax.random.key(0), max_new_tokens=int(sys.argv[3]),
    temperature=0.0, eos_ids=[2], pad_id=0,
)
state = nnx.state(policy.model)
print(json.dumps({
    "devices": jax.device_count(),
    "step": policy.step,
    "task_kind": policy.task_kind,
    "tokens": np.asarray(result.tokens).tolist(),
    "lengths": np.asarray(result.lengths).tolist(),
    "trainer_loaded": sorted(m for m in sys.modules if m.startswith("gdro_jax.train")),
    "started": opened_with,
    "placements": sorted({len(x.sharding.device_set) for x in jax.tree.leaves(state)}),
}))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("restore")
    init = root / "warm_start"
    config = small_run_config(steps=2, **{"checkpoint.every_steps": 1})
    architecture = models.DecoderConfig.from_dict(config.model.to_dict())
    models.save_pretrained(
        models.init_decoder(architecture, seed=5), init, tokenizer=tasks.hf_tokenizer()
    )
    finished = {}
    for name, mesh in MESHES.items():
        config = small_run_config(steps=2, **{"checkpoint.every_steps": 1, "init_from": str(init)})
        config.mesh.update(mesh)
        result = train.train(config, root / name)
        shutil.rmtree(root / name / models.MODEL_DIR)  # the checkpoints alone remain
        trained = nnx.merge(result["run"].program.graphdef, result["state"].params)
        params = nnx.state(trained, nnx.Param)
        prompts = [row[: int(n)].tolist() for row, n in zip(
            result["run"].task.prompt_tokens[:4], result["run"].task.prompt_lengths[:4], strict=True
        )]  # fmt: skip
        finished[name] = (root / name, jax.tree.map(np.asarray, params), prompts)
    shutil.rmtree(init)  # a read of the runs' init_from would now fail
    return finished


def _greedy(model, prompts):
    result = sampling.generate(
        model, prompts, key=jax.random.key(0), max_new_tokens=NEW_TOKENS, temperature=0.0,
        eos_ids=[2], pad_id=0,
    )  # fmt: skip
    return np.asarray(result.tokens).tolist(), np.asarray(result.lengths).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MESHES))
def test_the_policy_alone_is_restored_on_one_device_with_the_final_parameters(runs, name):
    workdir, final, _ = runs[name]
    restored = checkpoint.restore_policy(workdir)
    assert restored.step == 2 and restored.config["mesh"] == MESHES[name]
    params = nnx.state(restored.model, nnx.Param)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(final), strict=True):
        assert len(got.sharding.device_set) == 1
        np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MESHES))
def test_a_one_device_process_opens_the_run_without_the_trainer_and_decodes_as_the_mesh_does(
    runs, name
):
    workdir, _, prompts = runs[name]
    mesh = models.make_mesh(**MESHES[name])
    on_mesh = checkpoint.restore_policy(workdir, mesh=mesh)
    assert max(len(x.sharding.device_set) for x in jax.tree.leaves(nnx.state(on_mesh.model))) > 1
    tokens, lengths = _greedy(on_mesh.model, prompts)

    env = dict(os.environ, XLA_FLAGS=xla_flags(xla_force_host_platform_device_count=1))
    process = subprocess.run(
        [sys.executable, "-c", _OPEN, str(workdir), json.dumps(prompts), str(NEW_TOKENS)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    opened = json.loads(process.stdout.strip().splitlines()[-1])
    assert opened["devices"] == 1 and opened["placements"] == [1]
    assert opened["step"] == 2 and opened["task_kind"] == "chain"
    assert opened["trainer_loaded"] == [], "evaluation imported the trainer"
    assert opened["started"] == [], "evaluation started processes"
    assert opened["tokens"] == tokens and opened["lengths"] == lengths


def test_a_folder_without_checkpoints_is_named(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        checkpoint.restore_policy(tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no checkpoints/ folder"):
        checkpoint.restore_policy(tmp_path / "missing")
