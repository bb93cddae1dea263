"""verl's advantage registry, data and trainer with the controllers inside (`make test-verl`).

verl 0.9.1 imports on CPU without a GPU or a Ray cluster (ray is installed and imported, never
started): its registry (`register_adv_est`, `get_adv_estimator_fn`), `compute_advantage`,
`DataProto`, its dataset (`RLHFDataset` over a JSON-lines file written here, `collate_fn`) and its
stateful data loader all run here. Each step is made as `RayPPOTrainer.fit` makes it: the loader's
batch becomes a `DataProto`, each prompt gets a uuid `uid`, `_get_gen_batch` (the adapter's, then
verl's own) splits off the generation batch, the rows are repeated `rollout.n` times and joined
with a rollout's fields (responses of varied lengths and their scores, made here in place of a
model), verl's own `_balance_batch` reorders them for two data-parallel ranks, and verl's
`compute_advantage` runs the registered estimator. The trainer object is built without its
`__init__` (which starts Ray worker groups on GPUs): verl's methods run on it with the
data-parallel size given.

verl 0.9.1 has no `AbstractCurriculumSampler`: pull request 6302 removed it with the trainer's
call of `sampler.update(batch)`. The sampler is tested through that protocol all the same
(`__iter__` under verl's loader, `update(batch)` with the step's `DataProto`).

The references are independent of the adapter: GRPO's advantages recomputed in numpy from the
batch's scores grouped by uid, and the controllers' pure functions (`multi_adversary`'s `plan` and
`update`, called directly) fed the scores by prompt id, counted in a Python loop.

Planted bugs each test was seen failing on: the multipliers not applied to verl's advantages
(`test_the_estimator...`: the advantages differ from GRPO times the multipliers at step 2); the
rewards observed by row position (`np.repeat` of the batch) instead of each row's prompt id
(`test_the_estimator...`: the state differs from the pure functions'; `test_rows_reordered...`:
the reordered run's state differs from the unordered run's); the sampler drawing every batch of
the epoch when iteration starts (`test_the_sampler...`: its second draw comes before the first
step's rewards and is refused); `update` observing the batch again (`test_the_sampler...`: the
host API refuses the second observation); `_get_gen_batch` not binding the uids (every test that
makes a step: the estimator refuses an unbound uid); the estimator's group-size check removed
(`test_a_rank_s_shard...`: a shard reaches `observe`, whose refusal does not name the fix).
"""

from __future__ import annotations

import json
import uuid
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdro_jax import controllers
from gdro_jax.integrations import HostControllers

pytestmark = [
    pytest.mark.verl,
    # torchdata's stateful loader calls a deprecated torch function at each iteration
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]
pytest.importorskip("verl", reason="the verl extra: make test-verl")

with warnings.catch_warnings():  # verl warns about the engines (megatron, ...) it cannot load
    warnings.simplefilter("ignore")
    import torch
    from omegaconf import OmegaConf
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import compute_advantage, compute_response_mask
    from verl.trainer.ppo.utils import create_rl_sampler
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from gdro_jax.integrations import verl as gdro_verl

D = 6  # prompts in the pool: row d of the dataset is prompt d (extra_info["index"] == d)
B = 3  # prompts a step (data.train_batch_size)
N = 4  # responses a prompt (actor_rollout_ref.rollout.n)
DP = 2  # data-parallel ranks balance_batch evens the tokens of
PROMPT_LENGTH, RESPONSE_LENGTH = 3, 6
SOLVE_RATE = np.linspace(0.05, 0.95, D)  # the stand-in policy: prompt d solves at this rate


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """verl's RLHFDataset over a JSON-lines file of the pool, as its data preparation writes."""
    folder = tmp_path_factory.mktemp("verl_data")
    path = folder / "train.jsonl"
    with open(path, "w") as file:
        for d in range(D):
            row = {
                "data_source": "toy",
                "prompt": [{"role": "user", "content": f"question {d}"}],
                "reward_model": {"ground_truth": str(d)},
                "extra_info": {"index": d, "split": "train"},
            }
            file.write(json.dumps(row) + "\n")
    config = OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(folder)})
    return RLHFDataset([str(path)], tokenizer=None, config=config)


def loader(dataset, sampler):
    """The train loader `RayPPOTrainer._create_dataloader` builds (no workers)."""
    return StatefulDataLoader(
        dataset=dataset,
        batch_size=B,
        num_workers=0,
        drop_last=True,
        collate_fn=collate_fn,
        sampler=sampler,
    )


def stand_in_trainer(advantage):
    """A GDRORayPPOTrainer without its __init__ (Ray worker groups on GPUs): verl's
    `_get_gen_batch` and `_balance_batch` run on it, with DP ranks."""
    trainer = object.__new__(gdro_verl.GDRORayPPOTrainer)
    trainer._gdro_advantage = advantage
    trainer.actor_rollout_wg = None
    trainer._get_dp_size = lambda worker_group, role: DP
    return trainer


def rollout(gen_batch, step, rng_seed=0):
    """What a rollout adds to the generation batch, repeated `N` times: responses of varied
    lengths and each one's score on its last token (1 with the prompt's solve rate)."""
    out = gen_batch.repeat(repeat_times=N, interleave=True)
    rows = len(out)
    ids = np.asarray([info.get("index", 0) for info in out.non_tensor_batch["extra_info"]])
    rng = np.random.default_rng([rng_seed, step])
    lengths = torch.as_tensor(rng.integers(1, RESPONSE_LENGTH + 1, rows))
    solved = rng.random(rows) < SOLVE_RATE[ids]
    response_tokens = torch.arange(RESPONSE_LENGTH)[None] < lengths[:, None]
    attention = torch.cat([torch.ones(rows, PROMPT_LENGTH), response_tokens.float()], dim=1)
    scores = torch.zeros(rows, RESPONSE_LENGTH)
    scores[torch.arange(rows), lengths - 1] = torch.as_tensor(solved, dtype=torch.float32)
    tensors = {
        "responses": torch.zeros(rows, RESPONSE_LENGTH, dtype=torch.long),
        "attention_mask": attention,
        "token_level_scores": scores,
        "row": torch.arange(rows),  # each response's place before any reordering
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=out.non_tensor_batch)


def verl_step(trainer, batch_dict, step, *, balance=True, config=None, rng_seed=0):
    """One step of `RayPPOTrainer.fit` up to its advantages, on CPU (see the module docstring)."""
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array(
        [str(uuid.uuid4()) for _ in range(len(batch))], dtype=object
    )
    gen_batch = trainer._get_gen_batch(batch)  # GDRORayPPOTrainer's: binds the uids
    batch = batch.repeat(repeat_times=N, interleave=True)
    batch = batch.union(rollout(gen_batch, step, rng_seed))
    batch.batch["response_mask"] = compute_response_mask(batch)
    if balance:
        trainer._balance_batch(batch, metrics={})
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    name = trainer._gdro_advantage.name
    config = AlgoConfig(adv_estimator=name) if config is None else config
    return compute_advantage(batch, adv_estimator=name, config=config)


def rows_of(batch):
    """Each row's prompt id, uid and score, read off the batch without the adapter."""
    ids = np.asarray([info["index"] for info in batch.non_tensor_batch["extra_info"]])
    scores = batch.batch["token_level_rewards"].sum(dim=-1).numpy().astype(np.float64)
    return ids, np.asarray(batch.non_tensor_batch["uid"]), scores


def grpo_reference(uids, scores, mask, epsilon=1e-6):
    """GRPO's advantages in numpy: each score less its uid group's mean, over the group's
    (unbiased) standard deviation, on the response's tokens."""
    out = np.empty_like(scores)
    for uid in set(uids.tolist()):
        rows = uids == uid
        group = scores[rows]
        out[rows] = (group - group.mean()) / (group.std(ddof=1) + epsilon)
    return out[:, None] * mask


def reference_controllers(adversary, steps, *, seed=0, draws=False):
    """The pure functions fed each step's scores by prompt id: (batches, multipliers by prompt
    id per step, state). `steps` holds (prompt ids, scores) of each step's rows, any order."""
    state = adversary.init()
    batches, weights = [], []
    for step, (ids, scores) in enumerate(steps):
        key = jax.random.fold_in(jax.random.key(seed), step)
        candidates = jnp.arange(B, dtype=jnp.int32) if draws else jnp.asarray(np.unique(ids))
        plan = adversary.plan(state, candidates, key)
        batch = np.asarray(plan.prompt_ids)
        assert len(set(batch.tolist())) == B  # each prompt once: counted below by its id
        batches.append(batch)
        multipliers = np.asarray(plan.advantage_weights).tolist()
        weights.append(dict(zip(batch.tolist(), multipliers, strict=True)))
        correct = []
        for prompt in batch.tolist():  # count each prompt's correct responses by hand
            correct.append(
                sum(1 for i, s in zip(ids, scores, strict=True) if i == prompt and s > 0.5)
            )
        state = adversary.update(
            state,
            plan._replace(num_rollouts=jnp.full((B,), N, jnp.int32)),
            jnp.asarray(batch),
            num_correct=jnp.asarray(correct, jnp.int32),
            losses=jnp.asarray([1.0 - c / N for c in correct], jnp.float32),
            valid=jnp.ones((B,), bool),
        )
    return batches, weights, state


def assert_states_equal(got, want):
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(want), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7, err_msg=jax.tree_util.keystr(path)
        )


def prompt_gdro_adversary(realisation="reweight"):
    classifier = controllers.passk_classifier(D, k=2)
    prompt = controllers.prompt_gdro(num_bins=classifier.num_bins, realisation=realisation)
    return controllers.multi_adversary(classifier, prompt, n_mean=N)


def mopps_adversary():
    sampler = controllers.mopps(D, candidates=2, target=0.5)
    return controllers.multi_adversary(
        controllers.passk_classifier(D, k=2), sampler=sampler, n_mean=N
    )


def shuffled_batches(dataset, steps, seed=1):
    """`steps` batches of verl's own train sampler (data.shuffle=True), epoch after epoch."""
    sampler = create_rl_sampler(OmegaConf.create({"shuffle": True, "seed": seed}), dataset)
    batches = []
    while len(batches) < steps:
        batches.extend(loader(dataset, sampler))
    return batches[:steps]


def test_the_estimator_through_verls_registry_weighs_grpo_by_the_multipliers(dataset):
    """Four steps of Prompt-GDRO (reweight) with verl's sampler, balance_batch on: the registry
    holds the estimator under its name; each step's advantages are GRPO's (numpy) times the
    multiplier of each row's prompt (the pure functions' plan); the state is the pure functions'
    fed the same scores by prompt id."""
    advantage = gdro_verl.GDROAdvantage(HostControllers(prompt_gdro_adversary(), seed=3))
    assert core_algos.get_adv_estimator_fn("gdro_grpo") is advantage
    trainer = stand_in_trainer(advantage)
    outputs = [verl_step(trainer, bd, s) for s, bd in enumerate(shuffled_batches(dataset, 4))]
    steps = [rows_of(out)[::2] for out in outputs]  # (ids, scores)
    _, weights, state = reference_controllers(prompt_gdro_adversary(), steps, seed=3)
    assert any(w != 1.0 for step in weights for w in step.values()), "the multipliers stay 1"
    for step, out in enumerate(outputs):
        ids, uids, scores = rows_of(out)
        rows = out.batch["row"].numpy()
        assert not np.array_equal(rows, np.arange(B * N)), "balance_batch left the rows in order"
        mask = out.batch["response_mask"].numpy()
        expected = (
            grpo_reference(uids, scores, mask) * np.vectorize(weights[step].get)(ids)[:, None]
        )
        np.testing.assert_allclose(
            out.batch["advantages"].numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=f"step {step}"
        )
    assert advantage.controllers.step == 4
    assert_states_equal(advantage.controllers.state, state)


def test_rows_reordered_as_balance_batch_does_give_the_state_of_unordered_rows(dataset):
    """The same steps with and without verl's balance_batch: the controllers' bytes are equal,
    and each response's advantage is the same wherever its row went."""
    batches = shuffled_batches(dataset, 3, seed=5)
    runs = []
    for balance in (False, True):
        advantage = gdro_verl.GDROAdvantage(HostControllers(prompt_gdro_adversary(), seed=1))
        trainer = stand_in_trainer(advantage)
        outputs = [verl_step(trainer, bd, s, balance=balance) for s, bd in enumerate(batches)]
        runs.append((advantage.controllers.to_bytes(), outputs))
    (plain_bytes, plain), (balanced_bytes, balanced) = runs
    assert plain_bytes == balanced_bytes
    for step, (a, b) in enumerate(zip(plain, balanced, strict=True)):
        assert np.array_equal(a.batch["row"].numpy(), np.arange(B * N))
        assert not np.array_equal(b.batch["row"].numpy(), np.arange(B * N)), f"step {step}"
        by_row = torch.empty_like(b.batch["advantages"])
        by_row[b.batch["row"]] = b.batch["advantages"]
        torch.testing.assert_close(by_row, a.batch["advantages"], msg=f"step {step}")


def test_the_sampler_draws_the_pure_plan_from_the_state_after_the_previous_rewards(dataset):
    """MoPPS drawing through GDROSampler under verl's loader and dataset, four steps over two
    epochs: each batch's rows are the pure functions' draw from the state after the previous
    step's scores; `update(batch)` accepts each balanced step; the state is the pure
    functions'."""
    host = HostControllers(mopps_adversary(), seed=2)
    advantage = gdro_verl.GDROAdvantage(host)
    sampler = gdro_verl.GDROSampler(host, batch_size=B)
    assert len(sampler) == (D // B) * B
    trainer = stand_in_trainer(advantage)
    train_loader = loader(dataset, sampler)
    assert len(train_loader) == D // B
    drawn, steps = [], []
    for _epoch in range(2):
        for batch_dict in train_loader:
            drawn.append(np.asarray([info["index"] for info in batch_dict["extra_info"]]))
            out = verl_step(trainer, batch_dict, len(steps))
            sampler.update(out)
            steps.append(rows_of(out)[::2])
    batches, _, state = reference_controllers(mopps_adversary(), steps, seed=2, draws=True)
    assert len(batches) == 4
    for step, (got, want) in enumerate(zip(drawn, batches, strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")
    assert_states_equal(host.state, state)


def test_the_sampler_refuses_a_read_ahead_and_update_checks_the_step(dataset):
    """A loader reading the next batch before the step's rewards (workers) is refused, naming
    data.dataloader_num_workers; `update` refuses a step the estimator did not observe, a second
    check of a step, and rows that are not the drawn batch."""
    host = HostControllers(mopps_adversary(), seed=0)
    advantage = gdro_verl.GDROAdvantage(host)
    sampler = gdro_verl.GDROSampler(host, batch_size=B)
    rows = iter(sampler)
    first = [next(rows) for _ in range(B)]
    with pytest.raises(RuntimeError, match="dataloader_num_workers=0"):
        next(rows)
    batch_dict = collate_fn([dataset[d] for d in first])
    plain = gdro_verl.GDROAdvantage(HostControllers(prompt_gdro_adversary()), name="gdro_other")
    unobserved = verl_step(stand_in_trainer(plain), batch_dict, 0)  # another estimator's step
    with pytest.raises(RuntimeError, match="were not observed"):
        sampler.update(unobserved)
    out = verl_step(stand_in_trainer(advantage), batch_dict, 0)
    wrong = out.select_idxs(np.arange(len(out)))
    wrong.non_tensor_batch["extra_info"] = np.array(
        [{"index": (info["index"] + 1) % D} for info in out.non_tensor_batch["extra_info"]]
    )
    with pytest.raises(ValueError, match="not step 0's drawn prompts"):
        sampler.update(wrong)
    sampler.update(out)
    with pytest.raises(RuntimeError, match="already checked"):
        sampler.update(out)


def test_the_estimator_refuses_what_it_cannot_count(dataset):
    """Each refusal names the setting or field to fix, and leaves the controllers as they were."""
    host = HostControllers(prompt_gdro_adversary(), seed=0)
    advantage = gdro_verl.GDROAdvantage(host)
    trainer = stand_in_trainer(advantage)
    (batch_dict,) = shuffled_batches(dataset, 1)
    kl = AlgoConfig(adv_estimator="gdro_grpo", use_kl_in_reward=True)
    with pytest.raises(ValueError, match="use_kl_in_reward=False"):
        verl_step(trainer, batch_dict, 0, config=kl)
    unbound = stand_in_trainer(advantage)
    unbound._get_gen_batch = lambda batch: gdro_verl.RayPPOTrainer._get_gen_batch(unbound, batch)
    with pytest.raises(ValueError, match="has no prompt id: bind"):
        verl_step(unbound, batch_dict, 0)
    no_index = dict(batch_dict, extra_info=np.array([{"split": "train"}] * B, dtype=object))
    with pytest.raises(ValueError, match=r"extra_info\['index'\] is None"):
        verl_step(trainer, no_index, 0)
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(B)], dtype=object)
    advantage.bind(batch)
    three = batch.repeat(repeat_times=3, interleave=True)  # rollout.n=3 against n_mean=4
    three.batch["token_level_rewards"] = torch.ones(3 * B, 2)
    three.batch["response_mask"] = torch.ones(3 * B, 2)
    with pytest.raises(ValueError, match=r"set actor_rollout_ref.rollout.n=4"):
        compute_advantage(three, adv_estimator="gdro_grpo", config=AlgoConfig())
    assert host.step == 0 and host.batch is None
    out = verl_step(trainer, batch_dict, 0)
    with pytest.raises(ValueError, match="already observed"):  # the same rows, again
        compute_advantage(out, adv_estimator="gdro_grpo", config=AlgoConfig())
    bare = DataProto.from_dict(
        tensors={key: out.batch[key] for key in ("token_level_rewards", "response_mask")}
    )
    with pytest.raises(ValueError, match="verl passed no uids"):
        compute_advantage(bare, adv_estimator="gdro_grpo", config=AlgoConfig())
    with pytest.raises(ValueError, match="the batch has no 'extra_info' field"):
        gdro_verl.prompt_ids_of(bare)
    assert host.step == 1
    drawing = gdro_verl.GDROAdvantage(HostControllers(mopps_adversary()), name="gdro_draws")
    with pytest.raises(ValueError, match="train_sampler=GDROSampler"):
        verl_step(stand_in_trainer(drawing), batch_dict, 0)
    rollout_gdro = HostControllers.for_method(
        "rollout_gdro", num_prompts=D, n_mean=N, trainer_can={"per_prompt_rollouts"}
    )
    with pytest.raises(ValueError, match="rollout.n is one number"):
        gdro_verl.GDROAdvantage(rollout_gdro, name="gdro_alloc")
    with pytest.raises(ValueError, match="keep verl's own train sampler"):
        gdro_verl.GDROSampler(host, batch_size=B)
    with pytest.raises(ValueError, match="has already been registered"):  # verl's own refusal
        gdro_verl.GDROAdvantage(HostControllers(prompt_gdro_adversary()), name="grpo")
    later = gdro_verl.GDROAdvantage(HostControllers(prompt_gdro_adversary()))
    assert core_algos.get_adv_estimator_fn("gdro_grpo") is later  # the newer one takes the name


def test_a_rank_s_shard_is_refused_and_identical_controllers_fed_the_gathered_rows_agree(
    dataset,
):
    """verl splits the balanced batch into a contiguous chunk a DP rank: one rank's shard
    observed alone is refused (its groups are split); each rank's identical controllers fed
    every rank's rows, gathered, end in the state of one driver's controllers."""
    (batch_dict,) = shuffled_batches(dataset, 1, seed=7)
    driver = gdro_verl.GDROAdvantage(HostControllers(prompt_gdro_adversary(), seed=4))
    trainer = stand_in_trainer(driver)
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(B)], dtype=object)
    gen_batch = trainer._get_gen_batch(batch)
    batch = batch.repeat(repeat_times=N, interleave=True).union(rollout(gen_batch, 0))
    batch.batch["response_mask"] = compute_response_mask(batch)
    trainer._balance_batch(batch, metrics={})
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    shards = batch.chunk(DP)  # what each rank receives
    ranks = []
    for rank in range(DP):
        own = gdro_verl.GDROAdvantage(
            HostControllers(prompt_gdro_adversary(), seed=4), name=f"gdro_rank{rank}"
        )
        own.bind(batch)
        with pytest.raises(ValueError, match="a rank's shard splits groups"):
            compute_advantage(shards[rank], adv_estimator=own.name, config=AlgoConfig())
        gathered = DataProto.concat(shards)  # every rank's rows
        compute_advantage(gathered, adv_estimator=own.name, config=AlgoConfig())
        ranks.append(own.controllers.to_bytes())
    compute_advantage(batch, adv_estimator=driver.name, config=AlgoConfig())
    assert ranks[0] == ranks[1] == driver.controllers.to_bytes()


def test_check_config_refuses_each_setting_it_cannot_follow():
    """verl's own generated trainer config, set for the controllers, passes; each setting
    changed back is refused by its name."""
    from importlib.resources import files

    base = OmegaConf.load(files("verl.trainer.config") / "_generated_ppo_trainer.yaml")
    host = HostControllers(mopps_adversary())
    advantage = gdro_verl.GDROAdvantage(host)
    sampler = gdro_verl.GDROSampler(host, batch_size=B)
    good = {
        "trainer.use_v1": False,
        "algorithm.adv_estimator": "gdro_grpo",
        "actor_rollout_ref.rollout.n": N,
        "data.dataloader_num_workers": 0,
        "data.train_batch_size": B,
    }
    config = OmegaConf.merge(base, OmegaConf.from_dotlist([f"{k}={v}" for k, v in good.items()]))
    gdro_verl.check_config(config, advantage, sampler)
    for path, bad in [
        ("trainer.use_v1", True),
        ("algorithm.adv_estimator", "grpo"),
        ("algorithm.use_kl_in_reward", True),
        ("actor_rollout_ref.rollout.n", 8),
        ("data.dataloader_num_workers", 8),
        ("data.train_batch_size", 2 * B),
    ]:
        changed = OmegaConf.merge(config, OmegaConf.from_dotlist([f"{path}={bad}"]))
        with pytest.raises(ValueError, match=rf"^{path}={bad!r}: set {path}="):
            gdro_verl.check_config(changed, advantage, sampler)
    with pytest.raises(ValueError, match="data.gen_batch_size=6"):
        gdro_verl.check_config(
            OmegaConf.merge(config, OmegaConf.from_dotlist(["data.gen_batch_size=6"])),
            advantage,
            sampler,
        )
    with pytest.raises(ValueError, match="train_sampler=GDROSampler"):
        gdro_verl.check_config(config, advantage, None)


def test_the_verl_example_of_the_docs_runs(tmp_path):
    """docs/integrations.md's verl block (skipped by tests/test_docs.py, whose environment has no
    verl), run as that test runs the others: a fresh interpreter in an empty folder."""
    from tests.test_docs import run_extra_block

    process = run_extra_block("docs/integrations.md", "verl", tmp_path)
    assert process.returncode == 0, process.stderr[-3000:]
    assert "p_hat" in process.stdout
