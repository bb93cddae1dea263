"""Numerical parity with transformers' PyTorch models: logits on padded batches and greedy
generation, for Qwen3 (tied and untied), Llama and Qwen2."""

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from gdro_jax.models import from_pretrained
from gdro_jax.sampling import generate
from tests.models.hf_helpers import (
    hf_logits,
    make_hf_model,
    padded_batch,
    random_prompts,
    save_hf_model,
)

FAMILIES = ["qwen3_tied", "qwen3_untied", "llama", "qwen2"]
LENGTHS = (9, 4, 6, 1)
_forward = nnx.jit(lambda model, ids, positions, mask: model(ids, positions, mask))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    built = {}

    def get(arch):
        if arch not in built:
            hf_model = make_hf_model(arch)
            folder = save_hf_model(hf_model, tmp_path_factory.mktemp(arch))
            built[arch] = (hf_model, from_pretrained(folder))
        return built[arch]

    return get


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("arch", FAMILIES + ["llama_biased"])
def test_logits_match_transformers_on_padded_batch(pair, arch, side):
    hf_model, model = pair(arch)
    ids, mask, positions = padded_batch(random_prompts(LENGTHS), max(LENGTHS), left=side == "left")
    expected = hf_logits(hf_model, ids, mask, positions)
    ours = np.asarray(_forward(model, ids, positions, mask))
    np.testing.assert_allclose(ours[mask], expected[mask], atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", FAMILIES)
def test_greedy_generation_matches_transformers_generate(pair, arch):
    hf_model, model = pair(arch)
    prompts = random_prompts(LENGTHS, seed=1)
    width = max(LENGTHS)
    ids, mask, _ = padded_batch(prompts, width, left=True)
    with torch.no_grad():
        out = hf_model.generate(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            max_new_tokens=32,
            do_sample=False,
            pad_token_id=0,
        )
    expected = out[:, width:].numpy()
    result = generate(model, prompts, key=jax.random.key(0), max_new_tokens=32, temperature=0.0)
    assert expected.shape == (len(prompts), 32)
    np.testing.assert_array_equal(np.asarray(result.tokens), expected)
    np.testing.assert_array_equal(np.asarray(result.lengths), 32)
