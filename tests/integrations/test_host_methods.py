"""`HostControllers.for_method`: every method of `controllers.METHODS` from its config blocks,
refused when the trainer cannot express it; and the settings a restore compares.

Building a host compiles nothing (its plan and update are jitted at their first call), so these
tests build many.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np
import pytest
from flax import serialization

from gdro_jax import controllers
from gdro_jax.integrations import FORMAT, HostControllers

D = 12
PER_PROMPT = {"per_prompt_rollouts"}


def expressible(method: controllers.Method, trainer_can: set[str]) -> bool:
    """Written from the records, not from the host's code: a group filter never runs in the host
    API; a rollout allocation needs a trainer that draws per-prompt counts."""
    if method.group_filter is not None:
        return False
    return method.rollout_allocation is None or "per_prompt_rollouts" in trainer_can


@pytest.mark.parametrize("trainer_can", [set(), PER_PROMPT], ids=["one_count", "per_prompt"])
@pytest.mark.parametrize("name", list(controllers.METHODS))
def test_every_method_builds_or_is_refused_with_the_reason(name, trainer_can):
    method = controllers.METHODS[name]
    if not expressible(method, trainer_can):
        lacks = (
            rf"its group filter \({method.group_filter}\) .*the host API never holds"
            if method.group_filter is not None
            else rf"its rollout allocation \({method.rollout_allocation}\).*"
            r"trainer_can lacks 'per_prompt_rollouts'"
        )
        with pytest.raises(ValueError, match=rf"method '{name}' cannot run here: {lacks}"):
            HostControllers.for_method(name, num_prompts=D, trainer_can=trainer_can)
        return
    host = HostControllers.for_method(name, num_prompts=D, trainer_can=trainer_can, n_mean=3)
    adversary = host.adversary
    assert host.settings["method"] == name
    assert adversary.n_mean == 3 and host.num_prompts == D
    for decision in controllers.DECISIONS:
        assert host.settings[f"parts.{decision}"] == getattr(method, decision), decision
    for part in method.parts().values():  # every field of its block, defaults included
        assert any(key.startswith(f"{part}.") for key in host.settings), part


def test_the_blocks_override_the_defaults():
    host = HostControllers.for_method(
        "gdro_both",
        num_prompts=D,
        trainer_can=PER_PROMPT,
        classifier={"k": 2, "edges": (0.3, 0.7)},
        prompt_gdro=ml_collections.ConfigDict({"eta": 0.3}),
        rollout_gdro={"n_max": 6},
    )
    settings = host.settings
    assert (settings["classifier.k"], settings["classifier.edges"]) == (2, [0.3, 0.7])
    assert (settings["prompt_gdro.eta"], settings["prompt_gdro.gamma"]) == (0.3, 0.01)
    assert (settings["rollout_gdro.n_max"], settings["reward_values"]) == (6, [0.0, 1.0])
    assert host.adversary.num_bins == 3 and host.adversary.rollout_allocator.n_max == 6


def test_an_unknown_method_is_refused_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"method must be one of \('grpo', 'prompt_gdro'.*"):
        HostControllers.for_method("gdro", num_prompts=D)
    for name in controllers.METHODS:
        with pytest.raises(ValueError, match=f"'{name}'"):
            HostControllers.for_method("gdro", num_prompts=D)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"trainer_can": {"drop_groups"}}, r"trainer_can must hold names of \('per_prompt_ro"),
        ({"rollout_gdro": {}}, r"method 'prompt_gdro' has no block 'rollout_gdro'"),
        ({"prompt_gdro": {"etta": 0.3}}, r"prompt_gdro has no field 'etta': its fields are"),
        ({"prompt_gdro": {"num_bins": 3}}, r"prompt_gdro.num_bins is not a field of the"),
        ({"prompt_gdro": {"eta": -1.0}}, r"^prompt_gdro\.eta must be"),
        ({"classifier": {"k": 0}}, r"^classifier\.k must be an integer >= 1"),
        ({"classifier": {"bins_from": "previous_batch"}}, r"classifier\.bins_from='previous"),
        ({"num_prompts": 0}, r"num_prompts must be an int >= 1, got num_prompts=0"),
        ({"n_mean": 0}, r"n_mean must be an int >= 1, got n_mean=0"),
    ],
)
def test_misconfigured_blocks_are_refused_by_name(kwargs, match):
    kwargs = {"num_prompts": D, **kwargs}
    with pytest.raises(ValueError, match=match):
        HostControllers.for_method("prompt_gdro", **kwargs)


# -- the settings a restore compares ---------------------------------------------------------------


def built(**blocks) -> HostControllers:
    return HostControllers.for_method(
        "prompt_gdro", num_prompts=D, classifier={"k": 2, "edges": (0.3, 0.7)}, **blocks
    )


def test_a_restore_under_other_settings_names_every_field_that_differs():
    saved = built(prompt_gdro={"eta": 0.3}).to_bytes()
    other = HostControllers.for_method(
        "prompt_gdro",
        num_prompts=D,
        classifier={"k": 4, "edges": (0.3, 0.7)},
        prompt_gdro={"eta": 0.5, "realisation": "resample"},
        success_threshold=0.0,
    )
    before = other.to_bytes()
    with pytest.raises(ValueError) as error:
        other.load_bytes(saved)
    message = str(error.value)
    for field in (
        "classifier.k: saved 2, here 4",
        "prompt_gdro.eta: saved 0.3, here 0.5",
        "prompt_gdro.realisation: saved 'reweight', here 'resample'",
        "success_threshold: saved 0.5, here 0.0",
    ):
        assert field in message, (field, message)
    assert message.count(": saved ") == 4, message  # only those
    assert other.to_bytes() == before, "a refused restore changed the state"
    with pytest.raises(ValueError, match=r"method: saved 'prompt_gdro', here 'grpo'"):
        HostControllers.for_method("grpo", num_prompts=D).load_bytes(saved)


def test_a_restore_under_the_same_settings_loads():
    """The same blocks, or an adversary composed by hand (which records fewer fields: those
    both record are compared)."""
    host = built(prompt_gdro={"eta": 0.3})
    ids = host.select_prompts(np.arange(4))
    host.observe(np.repeat(ids, 4), np.tile([1.0, 0.0, 0.0, 1.0], 4))
    saved = host.to_bytes()
    again = built(prompt_gdro={"eta": 0.3})
    again.load_bytes(saved)
    assert again.to_bytes() == saved
    composed = controllers.multi_adversary(
        controllers.passk_classifier(D, k=2, edges=(0.3, 0.7)),
        controllers.prompt_gdro(num_bins=3, eta=0.3),
    )
    assert HostControllers.from_bytes(composed, saved).step == 1


def legacy_bytes(host: HostControllers) -> bytes:
    """What `to_bytes` wrote before the settings were saved (format gdro_jax.host/1)."""
    return serialization.msgpack_serialize(
        {
            "format": "gdro_jax.host/1",
            "seed": 5,
            "step": 2,
            "state": serialization.to_state_dict(jax.device_get(host.state)),
        }
    )


def test_bytes_without_settings_load_with_a_warning_and_their_shapes_checked():
    assert FORMAT == "gdro_jax.host/2"
    host = built()
    data = legacy_bytes(built())
    with pytest.warns(UserWarning, match=r"written before the settings were saved"):
        host.load_bytes(data)
    resaved = serialization.msgpack_restore(host.to_bytes())
    assert (host.step, resaved["seed"], resaved["format"]) == (2, 5, FORMAT)
    assert resaved["settings"] == host.settings  # saved again, the settings are recorded
    other = HostControllers.for_method("prompt_gdro", num_prompts=D + 1)
    before = other.to_bytes()
    with (
        pytest.warns(UserWarning),
        pytest.raises(ValueError, match=r"state\.classifier\.history: saved float32\[12, 8\]"),
    ):
        other.load_bytes(data)
    assert other.to_bytes() == before


@pytest.mark.parametrize("name", ["gdro_both", "mopps", "vip"])
def test_the_bytes_are_flaxs_msgpack_encoding_written_without_flax(name):
    """The host API writes its bytes without flax (the light install has none), in the encoding
    flax's `msgpack_serialize` writes: byte for byte the same for the same payload, read back
    by flax to the same arrays, and flax's bytes (how earlier versions wrote them) load. A
    planted change to the array encoding (another dtype name, or Fortran order) fails here."""
    host = HostControllers.for_method(name, num_prompts=D, trainer_can=PER_PROMPT, seed=3)
    ids = host.select_prompts(np.arange(4, dtype=np.int32))
    counts = host.allocate(ids)
    rollout_ids = np.repeat(ids, counts)
    rewards = np.where(np.arange(rollout_ids.size) % 3 == 0, 1.0, 0.0).astype(np.float32)
    host.observe(rollout_ids, rewards)
    ours = host.to_bytes()
    payload = {
        "format": FORMAT,
        "seed": 3,
        "step": 1,
        "settings": host.settings,
        "state": serialization.to_state_dict(jax.device_get(host.state)),
    }
    assert ours == serialization.msgpack_serialize(payload)
    restored = serialization.msgpack_restore(ours)
    leaves = jax.tree.leaves(payload["state"])
    assert len(jax.tree.leaves(restored["state"])) == len(leaves) > 0
    for got, want in zip(jax.tree.leaves(restored["state"]), leaves, strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    again = HostControllers.for_method(name, num_prompts=D, trainer_can=PER_PROMPT, seed=3)
    again.load_bytes(serialization.msgpack_serialize(payload))
    assert again.to_bytes() == ours
