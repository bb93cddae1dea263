"""Sampling on the 8-device fake CPU mesh (data 2, fsdp 2, tensor 2) equals one device's."""

import jax
import numpy as np
import pytest

from gdro_jax.models import from_pretrained, make_mesh
from gdro_jax.sampling import generate
from tests.models.hf_helpers import make_hf_model, random_prompts

PROMPTS = random_prompts((9, 4, 6, 1), seed=6)
SLOTS = np.array([0, 0, 1, 1, 2, 2, 3, 3], np.int32)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("q3")
    make_hf_model("qwen3_tied", seed=2).save_pretrained(folder)
    return from_pretrained(folder), from_pretrained(folder, mesh=make_mesh(2, 2, 2))


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.0, 0, 1.0), (1.0, 10, 0.9)])
def test_sharded_sampling_equals_single_device(models, temperature, top_k, top_p):
    single, sharded = models
    kwargs = dict(
        key=jax.random.key(3),
        max_new_tokens=16,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        prompt_of_slot=SLOTS,
        prompt_bucket=16,
        eos_ids=[5],
    )
    expected = generate(single, PROMPTS, **kwargs)
    result = generate(sharded, PROMPTS, **kwargs)
    assert len(sharded.layers.q[...].sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(result.tokens), np.asarray(expected.tokens))
    np.testing.assert_array_equal(np.asarray(result.lengths), np.asarray(expected.lengths))
    np.testing.assert_array_equal(
        np.asarray(result.finish_reasons), np.asarray(expected.finish_reasons)
    )
    np.testing.assert_allclose(
        np.asarray(result.logprobs), np.asarray(expected.logprobs), atol=1e-5
    )
