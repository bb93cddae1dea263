"""The decode-windows benchmark's bytes split (`bytes_by_kind`): its parts, each operation costed
alone, sum to XLA's figure for the whole step, and the KV cache part is the blocks read."""

import jax.numpy as jnp
import pytest

from benchmarks import decode_windows
from gdro_jax import models


@pytest.fixture(scope="module")
def model():
    config = decode_windows.POLICY.replace(num_layers=1, vocab_size=512)
    return models.init_decoder(config, seed=0)


@pytest.mark.parametrize("blocks", [(96,), (64, 32)])
def test_the_split_sums_to_the_whole_and_counts_the_blocks_read(model, blocks):
    accessed, kinds = decode_windows._step_cost(model, 8, blocks)
    assert kinds is not None, "jax's internal HLO bindings are missing"
    # To a few bytes: the constants and tuples' own moves are left out of the split.
    assert abs(sum(kinds.values()) - accessed) < 1e-4 * accessed
    config = model.config
    per_slot = 2 * config.num_kv_heads * config.head_dim * jnp.dtype(config.compute_dtype).itemsize
    assert kinds["kv_cache"] == 8 * sum(blocks) * per_slot  # keys and values, each block once
    # The embedding lookup of 8 rows is a gather XLA counts at the whole table, and the draw's
    # gather of one block of logits a row counts all the [8, V] logits.
    assert kinds["gathers"] >= config.vocab_size * (config.d_model + 8) * 4
