"""The warm start: supervised training of the policy on the chain task's worked solutions.

RL needs a "base" model that already solves easy problems and rarely solves hard ones (SPEC 11's
frontier: easiest level pass@1 > 0.8, hardest < 0.05 but with pass@8 above zero). `pretrain`
builds it: a Qwen3-shaped decoder trained by teacher forcing on `tasks.pretraining_rows` (which
never include a validation or test problem), with a next-token cross-entropy on the solution
tokens only, Adam(W) with linear warmup and cosine decay. It then evaluates the model on the
task's validation split, prints the per-level table, and saves a run folder:

    workdir/model/           HF folder (config.json, model.safetensors, tokenizer files):
                             `models.from_pretrained` and `transformers` both load it
    workdir/tokenizer/       the task tokenizer (`tasks.save_tokenizer`)
    workdir/frontier.json    per-level validation metrics, the frontier check, training times,
                             the machine and versions that made it (`runtime.environment`)
    workdir/pretrain.json    the config and its hash, written last (marks the folder complete)

A later call with the same config (same hash) reuses the folder instead of training again, so
every RL run of `make demo` starts from one warm start.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import pathlib
import shutil
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

from gdro_jax import configs, losses, models, runtime, tasks
from gdro_jax import eval as evaluation
from gdro_jax.models import MODEL_DIR, fit_spec

# Bump when a change to this module changes what a config trains, so old folders are not reused.
# 2: batches in data order (1 shuffled them, with optional length buckets). 3: the hash is taken
# over the fields that differ from the schema's defaults (`configs.canonical`).
FORMAT_VERSION = 3
TOKENIZER_DIR = "tokenizer"
FRONTIER_FILE = "frontier.json"
CONFIG_FILE = "pretrain.json"
# Config fields that do not change the trained model (left out of the hash).
_UNHASHED_FIELDS = ("progress",)


class PretrainResult(NamedTuple):
    """What `pretrain_model` returns."""

    model: models.Decoder  # the trained policy
    losses: np.ndarray  # [steps] float32 training loss of every step
    seconds: float  # wall-clock seconds of data preparation, compilation and training


def read_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` with every field of the warm-start schema (`configs.pretrain_schema`); a
    ValueError names a field the schema does not know."""
    schema = configs.pretrain_schema()
    configs.check_known(config, schema)
    return configs.complete(config, schema)


def task_config(config: ml_collections.ConfigDict) -> tasks.ChainTaskConfig:
    """The `ChainTaskConfig` of `config.task` (the same fields as the RL configs' `task`)."""
    return configs.chain_task_config(config)


def decoder_config(config: ml_collections.ConfigDict) -> models.DecoderConfig:
    """The policy's `DecoderConfig` from `config.model`, with the task tokenizer's special ids."""
    fields = read_config(config).model.to_dict()
    if fields.get("vocab_size", tasks.VOCAB_SIZE) != tasks.VOCAB_SIZE:
        raise ValueError(
            f"model.vocab_size must be the task's {tasks.VOCAB_SIZE}, "
            f"got model.vocab_size={fields['vocab_size']}"
        )
    fields.update(
        vocab_size=tasks.VOCAB_SIZE,
        bos_token_id=tasks.BOS_ID,
        eos_token_ids=(tasks.EOS_ID,),
        pad_token_id=tasks.PAD_ID,
    )
    return models.DecoderConfig.from_dict(fields)


def config_hash(config: ml_collections.ConfigDict) -> str:
    """A stable hash of everything in `config` that decides the trained model (hex, 16 chars):
    its fields that differ from the schema's defaults (`configs.canonical`), so a field left out
    and one set to its default hash alike."""
    canonical = configs.canonical(config, configs.pretrain_schema())
    fields = {k: v for k, v in canonical.items() if k not in _UNHASHED_FIELDS}
    fields["format_version"] = FORMAT_VERSION
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def supervised_loss(
    model: models.Decoder, tokens_BQ: jax.Array, loss_mask_BQ: jax.Array
) -> jax.Array:
    """Next-token cross-entropy of `tokens_BQ[:, 1:]` weighted by `loss_mask_BQ[:, 1:]`.

    Args:
      model: the policy.
      tokens_BQ: `SupervisedArrays.tokens` (`<bos>` prompt solution `<eos>`, right padding).
      loss_mask_BQ: `SupervisedArrays.loss_mask` (1 on the solution and its `<eos>`).

    Returns:
      The token-mean loss over solution tokens (prompt and padding targets weigh 0).
    """
    inputs_BT = tokens_BQ[:, :-1]
    positions_BT = jnp.broadcast_to(jnp.arange(inputs_BT.shape[1]), inputs_BT.shape)
    # Padding sits after each sequence's end, so causal attention already keeps it out of every
    # position whose target is weighted; no attention mask is needed.
    logits_BTV = model(inputs_BT, positions_BT)
    return losses.masked_cross_entropy(logits_BTV, tokens_BQ[:, 1:], loss_mask_BQ[:, 1:])


@functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
def _train_step(graphdef, state, tokens_BQ, loss_mask_BQ):
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(supervised_loss)(model, tokens_BQ, loss_mask_BQ)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), loss


def pretrain_model(
    config: ml_collections.ConfigDict, *, mesh: jax.sharding.Mesh | None = None
) -> PretrainResult:
    """Trains the warm-start policy by teacher forcing on worked solutions (no evaluation, no I/O).

    Batch `t` holds rows `t*B .. (t+1)*B - 1` of `tasks.pretraining_rows(task, steps*B,
    seed=train.data_seed, tail_base=train.tail_base)` (levels mixed, every row seen once), padded
    to the task's longest sequence. Grouping rows of similar length into batches would halve the
    cost of a step on this heavy-tailed mix, but we measured it learning more slowly per example,
    for no gain per CPU-second, so batches stay mixed as in SPEC 11's check.

    Args:
      config: the pretrain config (see `experiments/configs/pretrain_tiny.py`): `seed` (parameter
        initialisation), `task`, `model`, `train`, `progress`.
      mesh: a `data` x `fsdp` x `tensor` mesh (batches on `data` x `fsdp`), or None for one device.

    Returns:
      `PretrainResult(model, losses, seconds)`.
    """
    start = time.perf_counter()
    config = read_config(config)
    train = config.train
    for name in ("steps", "batch_size"):
        value = train[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {name}={value!r}")
    task = task_config(config)
    rows = tasks.pretraining_rows(
        task, train.steps * train.batch_size, seed=train.data_seed, tail_base=train.tail_base
    )
    data = tasks.supervised_arrays(rows, task)
    shape = (train.steps, train.batch_size, task.sequence_length)
    batches = zip(data.tokens.reshape(shape), data.loss_mask.reshape(shape), strict=True)
    model = models.init_decoder(decoder_config(config), seed=config.seed, mesh=mesh)
    tx = configs.make_optimizer(configs.OptimizerConfig.from_block(train), decay_steps=train.steps)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))

    def place(batch):
        if mesh is None:
            return jax.device_put(batch)
        spec = fit_spec(P(("data", "fsdp"), None), batch[0].shape, dict(mesh.shape))
        return jax.device_put(batch, NamedSharding(mesh, spec))

    losses_T = []
    bar = tqdm(batches, desc="warm start", total=train.steps, disable=not config.progress)
    bar.set_postfix_str(runtime.COMPILING_NOTE)  # until the first loss replaces it
    for step, batch in enumerate(bar):
        state, loss = _train_step(graphdef, state, *place(batch))
        losses_T.append(loss)
        # Reading the loss waits for the step; doing it every 10 steps keeps dispatch ahead.
        if step % 10 == 0 or step == train.steps - 1:
            bar.set_postfix(loss=f"{float(loss):.4f}")
    bar.close()
    model, _ = nnx.merge(graphdef, state)
    losses = np.asarray(jax.device_get(losses_T), np.float32)
    return PretrainResult(model=model, losses=losses, seconds=time.perf_counter() - start)


def check_frontier(
    result: evaluation.ChainEvaluation,
    *,
    easiest_min_pass1: float,
    hardest_max_pass1: float,
    hardest_k: int,
) -> dict[str, Any]:
    """SPEC 11's frontier check on a per-level evaluation.

    Args:
      result: the evaluation (levels 1..L).
      easiest_min_pass1: the easiest level's pass@1 must exceed this (SPEC: 0.8).
      hardest_max_pass1: the hardest level's pass@1 must stay below this (SPEC: 0.05) and above 0.
      hardest_k: the hardest level's pass@k for this k must be above 0 (SPEC: pass@8).

    Returns:
      A dict with the three measured values and `satisfied` (bool).
    """
    easiest, hardest = min(result.by_level), max(result.by_level)
    easiest_pass1 = result.pass_at(1, easiest)
    hardest_pass1 = result.pass_at(1, hardest)
    hardest_pass_k = result.pass_at(hardest_k, hardest)
    return {
        "easiest_level": easiest,
        "hardest_level": hardest,
        "easiest_pass@1": easiest_pass1,
        "hardest_pass@1": hardest_pass1,
        f"hardest_pass@{hardest_k}": hardest_pass_k,
        "easiest_min_pass@1": easiest_min_pass1,
        "hardest_max_pass@1": hardest_max_pass1,
        "satisfied": bool(
            easiest_pass1 > easiest_min_pass1
            and 0.0 < hardest_pass1 < hardest_max_pass1
            and hardest_pass_k > 0.0
        ),
    }


def _read_json(path: pathlib.Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def pretrain(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    *,
    mesh: jax.sharding.Mesh | None = None,
) -> pathlib.Path:
    """Trains (or reuses) the warm start, evaluates it on validation, saves the run folder.

    If `workdir/pretrain.json` records the same `config_hash(config)` and the model folder
    exists, nothing is trained: the stored table is printed and the folder returned. Otherwise
    any earlier contents of `workdir/model` are replaced.

    Args:
      config: the pretrain config (see `experiments/configs/pretrain_tiny.py`).
      workdir: the run folder (created if missing); layout in the module docstring.
      mesh: optional mesh for training; by default `config.mesh` (1 x 1 x 1 means one device).

    Returns:
      The HF model folder `workdir/model` (load it with `models.from_pretrained`).
    """
    config = read_config(config)
    workdir = pathlib.Path(workdir)
    model_dir = workdir / MODEL_DIR
    digest = config_hash(config)
    stored = _read_json(workdir / CONFIG_FILE)
    if stored is not None and stored.get("config_hash") == digest and model_dir.is_dir():
        frontier = _read_json(workdir / FRONTIER_FILE) or {}
        print(f"warm start: reusing {model_dir} (config hash {digest})")
        if "table" in frontier:
            print(frontier["table"])
        return model_dir
    if stored is not None:
        logging.info(
            "warm start: config changed (hash %s -> %s), retraining",
            stored.get("config_hash"),
            digest,
        )
    (workdir / CONFIG_FILE).unlink(missing_ok=True)
    if model_dir.exists():
        shutil.rmtree(model_dir)

    cpu_start = time.process_time()
    mesh = models.run_mesh(*configs.mesh_shape_of(config)) if mesh is None else mesh
    trained = pretrain_model(config, mesh=mesh)
    train_cpu_seconds = time.process_time() - cpu_start

    eval_start, eval_cpu_start = time.perf_counter(), time.process_time()
    task = task_config(config)
    ev = config.eval
    result = evaluation.evaluate_chain(
        trained.model, tasks.build_splits(task).validation, task, ev, progress=config.progress,
        label="eval warm start (validation)",
    )  # fmt: skip
    eval_seconds = time.perf_counter() - eval_start
    eval_cpu_seconds = time.process_time() - eval_cpu_start
    frontier = check_frontier(
        result,
        easiest_min_pass1=config.frontier.easiest_min_pass1,
        hardest_max_pass1=config.frontier.hardest_max_pass1,
        hardest_k=ev.num_samples,
    )
    table = result.to_table()
    print(f"warm start: validation, {ev.num_samples} samples per problem at T={ev.temperature}")
    print(table)
    verdict = "meets" if frontier["satisfied"] else "MISSES"
    print(
        f"warm start {verdict} the SPEC 11 frontier: level {frontier['easiest_level']} pass@1 "
        f"{frontier['easiest_pass@1']:.3f} (> {frontier['easiest_min_pass@1']}), level "
        f"{frontier['hardest_level']} pass@1 {frontier['hardest_pass@1']:.4f} "
        f"(in (0, {frontier['hardest_max_pass@1']})), pass@{ev.num_samples} "
        f"{frontier[f'hardest_pass@{ev.num_samples}']:.3f} (> 0)"
    )
    print(
        f"warm start: train {trained.seconds:.1f} s wall / {train_cpu_seconds:.1f} s CPU, "
        f"eval {eval_seconds:.1f} s wall / {eval_cpu_seconds:.1f} s CPU, "
        f"final loss {trained.losses[-1]:.4f}"
    )
    if not frontier["satisfied"]:
        logging.warning("warm start misses the SPEC 11 frontier: %s", frontier)

    workdir.mkdir(parents=True, exist_ok=True)
    models.save_pretrained(trained.model, model_dir, tokenizer=tasks.hf_tokenizer())
    tasks.save_tokenizer(workdir / TOKENIZER_DIR)
    metrics = {
        "config_hash": digest,
        "split": "validation",
        "frontier": frontier,
        "evaluation": result.to_dict(),
        "table": table,
        "train": {
            "steps": config.train.steps,
            "first_loss": float(trained.losses[0]),
            "final_loss": float(trained.losses[-1]),
            "losses": trained.losses.tolist(),
            "wall_seconds": trained.seconds,
            "cpu_seconds": train_cpu_seconds,
        },
        "eval": {"wall_seconds": eval_seconds, "cpu_seconds": eval_cpu_seconds},
        "environment": runtime.environment(),
    }
    (workdir / FRONTIER_FILE).write_text(json.dumps(metrics, indent=2))
    (workdir / CONFIG_FILE).write_text(
        json.dumps({"config_hash": digest, "config": config.to_dict()}, indent=2, default=str)
    )
    return model_dir
