"""Memory footprint of a decoder on a mesh shape, from `jax.eval_shape` alone (no weights, no
devices): parameters, AdamW moments and the sampler's KV cache, per device."""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
from flax import nnx

from gdro_jax.models._config import DecoderConfig
from gdro_jax.models._decoder import abstract_decoder
from gdro_jax.models._mesh import MESH_AXES, fit_spec
from gdro_jax.models._sharding import ShardingConfig


class Footprint(NamedTuple):
    """Sizes in bytes; `*_per_device` are the largest shard any device holds."""

    param_count: int  # total number of parameters
    param_bytes: int  # all parameters, in the parameter dtype
    param_bytes_per_device: int
    adam_bytes_per_device: int  # AdamW first and second moments, float32
    kv_cache_bytes_per_device: int  # L x 2 x [B, K, S, H] keys and values, compute dtype


def _shard_elements(shape, spec, axis_sizes) -> int:
    fitted = fit_spec(spec, shape, axis_sizes)
    count = 1
    for dim, entry in zip(shape, fitted, strict=True):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
        count *= dim // int(np.prod([axis_sizes[a] for a in axes], dtype=np.int64))
    return count


def memory_footprint(
    config: DecoderConfig,
    *,
    data: int = 1,
    fsdp: int = 1,
    tensor: int = 1,
    batch: int = 1,
    seq_len: int = 0,
    sharding: ShardingConfig | None = None,
) -> Footprint:
    """Per-device memory of `config` on a `data` x `fsdp` x `tensor` mesh.

    Args:
      config: the architecture (its dtypes decide the byte sizes).
      data: data axis size.
      fsdp: fsdp axis size.
      tensor: tensor axis size.
      batch: sequences in the KV cache (global batch).
      seq_len: cache slots per sequence (prompt + new tokens); 0 for no cache.
      sharding: the specs (default ShardingConfig()).

    Returns:
      The Footprint.
    """
    for name, value in (("data", data), ("fsdp", fsdp), ("tensor", tensor), ("batch", batch)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"memory_footprint: {name} must be a positive int, got {value!r}")
    sharding = sharding or ShardingConfig()
    axis_sizes = dict(zip(MESH_AXES, (data, fsdp, tensor), strict=True))
    state = nnx.state(abstract_decoder(config, sharding=sharding))
    leaves = jax.tree.leaves(state)
    specs = jax.tree.leaves(
        nnx.get_partition_spec(state), is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
    )
    itemsize = np.dtype(config.param_dtype).itemsize
    count = sum(int(np.prod(leaf.shape)) for leaf in leaves)
    per_device = sum(
        _shard_elements(leaf.shape, spec, axis_sizes)
        for leaf, spec in zip(leaves, specs, strict=True)
    )
    c = config
    layer_cache_shape = (batch, c.num_kv_heads, seq_len, c.head_dim)
    layer_cache = _shard_elements(layer_cache_shape, sharding.cache_bksh, axis_sizes)
    cache = 2 * c.num_layers * layer_cache if seq_len else 0
    return Footprint(
        param_count=count,
        param_bytes=count * itemsize,
        param_bytes_per_device=per_device * itemsize,
        adam_bytes_per_device=2 * per_device * 4,
        kv_cache_bytes_per_device=cache * np.dtype(c.compute_dtype).itemsize,
    )
