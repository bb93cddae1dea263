"""One schema per config kind: every shipped config holds every field; the defaults are the
library's (checked by behaviour against factories called with no arguments); an unknown field is
named with its nearest neighbours; a saved config from before a field existed still resumes; and
the canonical form used for hashes and stamps ignores fields at their defaults."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import (
    demo,
    graded,
    paper_qwen3_1p7b,
    paper_qwen3_4b,
    paper_qwen3_8b,
    pretrain_graded,
    pretrain_tiny,
    rivals_pilot,
    study,
    tiny_cpu,
)
from gdro_jax import configs, controllers, step, tasks

RUN_CONFIGS = {
    "tiny_cpu": tiny_cpu.get_config,
    "paper_qwen3_1p7b": paper_qwen3_1p7b.get_config,
    "paper_qwen3_4b": paper_qwen3_4b.get_config,
    "paper_qwen3_8b": paper_qwen3_8b.get_config,
    "study.train": lambda: study.get_config().train,
    "demo.train": lambda: demo.get_config().train,
    "graded": graded.get_config,
    "rivals_pilot:cliff.train": lambda: rivals_pilot.get_config("cliff").train,
    "rivals_pilot:graded.train": lambda: rivals_pilot.get_config("graded").train,
}
PRETRAIN_CONFIGS = {
    "pretrain_tiny": pretrain_tiny.get_config,
    "study.pretrain": lambda: study.get_config().pretrain,
    "demo.pretrain": lambda: demo.get_config().pretrain,
    "pretrain_graded": pretrain_graded.get_config,
}


def _names(tree, prefix=""):
    """Every dotted field name of a nested dict (a schema or a config's `to_dict()`)."""
    names = set()
    for name, value in tree.items():
        if isinstance(value, dict):
            names |= _names(value, f"{prefix}{name}.")
        else:
            names.add(f"{prefix}{name}")
    return names


def _schema_names(schema):
    return {name for name, _, _ in configs.describe(schema)}


@pytest.mark.parametrize("name", list(RUN_CONFIGS))
def test_every_shipped_run_config_holds_every_field(name):
    config = RUN_CONFIGS[name]()
    assert _names(config.to_dict()) == _schema_names(configs.run_schema())


@pytest.mark.parametrize("name", list(PRETRAIN_CONFIGS))
def test_every_shipped_warm_start_config_holds_every_field(name):
    config = PRETRAIN_CONFIGS[name]()
    assert _names(config.to_dict()) == _schema_names(configs.pretrain_schema())


def test_every_field_has_a_line_of_help():
    for schema in (configs.run_schema(), configs.pretrain_schema()):
        missing = [name for name, _, help_text in configs.describe(schema) if not help_text]
        assert missing == []


def test_the_defaults_are_the_librarys():
    config = configs.run_config()
    assert step.GRPOConfig(**config.grpo.to_dict()) == step.GRPOConfig()
    assert tasks.ChainTaskConfig(**config.task.to_dict()) == tasks.ChainTaskConfig()
    assert tasks.MathTaskConfig(**config.math.to_dict()) == tasks.MathTaskConfig()
    # The controllers of the default config decide as the factories called without arguments.
    config.method = "gdro_both"
    built = configs.build_controllers(config, num_dataset_prompts=64)
    classifier = controllers.passk_classifier(64)
    by_hand = controllers.multi_adversary(
        classifier,
        controllers.prompt_gdro(classifier.num_bins),
        controllers.rollout_gdro(classifier.num_bins, n_mean=config.n_mean),
        n_mean=config.n_mean,
    )
    ids = jnp.arange(config.num_prompts, dtype=jnp.int32)
    states = [gdro.init() for gdro in (built, by_hand)]
    for step_index in range(3):
        key = jax.random.key(step_index)
        plans = [gdro.plan(s, ids, key) for gdro, s in zip((built, by_hand), states, strict=True)]
        for a, b in zip(jax.tree.leaves(plans[0]), jax.tree.leaves(plans[1]), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        correct = (ids * (step_index + 1)) % (plans[0].num_rollouts + 1)
        losses = 1.0 - correct / plans[0].num_rollouts
        states = [
            gdro.update(s, plan, ids, num_correct=correct, losses=losses)
            for gdro, s, plan in zip((built, by_hand), states, plans, strict=True)
        ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(modle=dict(compute_dtype="bfloat16")), r"config\.modle: .*model\?"),
        (lambda c: c.grpo.__setattr__("eps_hi", 0.3), r"config\.grpo\.eps_hi: .*eps_high"),
        (
            lambda c: c.rollout_gdro.__setattr__("nmax", 8),
            r"config\.rollout_gdro\.nmax: .*n_max\?",
        ),
    ],
    ids=["block", "field", "part-field"],
)
def test_an_unknown_field_is_named_with_its_nearest_names(change, message):
    config = tiny_cpu.get_config()
    change(config)
    with pytest.raises(ValueError, match=message):
        configs.read_run_config(config)


def test_a_config_saved_before_a_field_existed_resumes_under_its_default():
    config = tiny_cpu.get_config()
    saved = configs.config_dict(config)
    del saved["rollout"], saved["grpo"]["logprob_chunk_tokens"], saved["prompt_gdro"]["clip"]
    assert configs.config_differences(saved, config) == []
    assert "rollout" in configs.complete(saved, configs.run_schema())
    changed = tiny_cpu.get_config()
    changed.prompt_gdro.clip = None  # the saved run had the default, 10.0
    assert configs.config_differences(saved, changed) == ["prompt_gdro.clip: saved 10.0, now None"]


def test_the_canonical_form_ignores_fields_at_their_defaults():
    schema = configs.run_schema()
    # grpo.pack_sequences and rollout.batching: packed and continuous by default, but the
    # configs written before them (the declared study's stored stamps) ran padded and static, so
    # today's defaults are what the canonical form names.
    packed = {"grpo": {"pack_sequences": True}, "rollout": {"batching": "continuous"}}
    assert configs.canonical(configs.run_config(), schema) == packed
    explicit = configs.run_config()
    explicit.grpo.eps_high = 0.28  # the default, set by hand
    left_out = configs.config_dict(configs.run_config())
    del left_out["grpo"]["eps_high"]
    assert configs.canonical(explicit, schema) == configs.canonical(left_out, schema) == packed
    changed = configs.run_config()
    changed.grpo.update(eps_high=0.3, pack_sequences=False)
    changed.rollout.batching = "static"
    changed.classifier.edges = (0.5,)
    assert configs.canonical(changed, schema) == {
        "grpo": {"eps_high": 0.3},
        "classifier": {"edges": (0.5,)},
    }


def test_a_config_from_before_packing_canonicalises_as_one_pinned_padded():
    """A stored config without `grpo.pack_sequences` ran padded, and one without
    `rollout.batching` sampled in static chunks: its canonical form (and so a study run's stamp)
    equals that of today's config pinning both, not of the defaults."""
    schema = configs.run_schema()
    before = configs.config_dict(configs.run_config())
    del before["grpo"]["pack_sequences"], before["rollout"]["batching"]
    pinned = configs.run_config()
    pinned.grpo.pack_sequences = False
    pinned.rollout.batching = "static"
    assert configs.canonical(before, schema) == configs.canonical(pinned, schema) == {}
    assert configs.canonical(configs.run_config(), schema) != {}


def test_run_settings_are_read_once_and_typed():
    settings = configs.read_run_config(tiny_cpu.get_config(), num_devices=1)
    assert configs.read_run_config(settings) is settings
    assert settings.method is controllers.METHODS["grpo"]
    assert settings.num_slots == 32 * 4 and settings.decisions.num_bins == 10
    assert settings.chain == tasks.ChainTaskConfig(**tiny_cpu.get_config().task.to_dict())
    assert settings.math is None and settings.grpo == step.GRPOConfig()
    assert settings.checkpoint == configs.CheckpointSettings(True, 10, 2)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"task_kind": "math", "tokenizer": "tok", "math.preset": "nope"},
            r"config\.math\.preset must be one of .*got preset='nope'",
        ),
        (
            {"task_kind": "math", "tokenizer": "tok", "math.limit": -1},
            r"config\.math\.limit must be an int >= 0",
        ),
        ({"task_kind": "math"}, r"the math task needs a tokenizer: set config\.tokenizer"),
        ({"task_kind": "text"}, r"config\.task_kind must be one of \('chain', 'math'\)"),
        ({"model.head_dim": 3}, r"config\.model\.head_dim must be a positive even int"),
        ({"task.num_levels": 3}, r"config\.task\.num_levels must be an int in \[6, 12\]"),
        ({"optimizer.learning_rate": 0.0}, r"config\.optimizer\.learning_rate must be > 0"),
    ],
)
def test_a_bad_value_is_named_under_its_block(fields, message):
    config = tiny_cpu.get_config()
    for dotted, value in fields.items():
        *blocks, name = dotted.split(".")
        node = config
        for block in blocks:
            node = node[block]
        node[name] = value
    with pytest.raises(ValueError, match=message):
        configs.read_run_config(config, num_devices=1)
