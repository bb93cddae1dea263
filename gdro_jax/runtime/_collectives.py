"""What several processes of one run exchange, one copy each: who writes, global arrays built from
host values, and the few host-side collectives (a stop signal, a file size, gathered results).

Every function works unchanged with one process, where it is a plain local operation.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def is_primary() -> bool:
    """True in process 0, the one that writes metrics, summaries, reports and exported models."""
    return jax.process_index() == 0


def global_array(value: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """A global array with `sharding` from a host value every process holds in full.

    Each process supplies its own devices' shards (`make_array_from_callback`), so this works
    whether or not the sharding spans several processes.
    """
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def replicate(tree, mesh: Mesh):
    """Places every leaf of `tree` fully replicated on `mesh` (which may span processes: every
    process then holds the same value and supplies its own devices' copies)."""
    sharding = NamedSharding(mesh, P())
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)

    def put(leaf):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = global_array(jax.device_get(jax.random.key_data(leaf)), sharding)
            wrap = functools.partial(jax.random.wrap_key_data, impl=jax.random.key_impl(leaf))
            return jax.jit(wrap, out_shardings=sharding)(data)
        return global_array(jax.device_get(leaf), sharding)

    return jax.tree.map(put, tree)


def agreed_signal(signum: int | None) -> int | None:
    """The stop signal any process received (the largest number), the same in every process."""
    if jax.process_count() == 1:
        return signum
    signals = multihost_utils.process_allgather(np.asarray(signum or 0, np.int32))
    return int(np.max(signals)) or None


def broadcast_from_primary(value: int) -> int:
    """Process 0's integer `value` in every process."""
    if jax.process_count() == 1:
        return int(value)
    return int(multihost_utils.broadcast_one_to_all(np.asarray(value, np.int32)))


def from_primary(tree: Any) -> Any:
    """Process 0's numpy `tree` in every process (each passes a tree of the same shapes)."""
    if jax.process_count() == 1:
        return tree
    return jax.tree.map(np.asarray, multihost_utils.broadcast_one_to_all(tree))


def gather(tree: Any) -> list[Any]:
    """Every process's numpy `tree` (same shapes in all), in process order."""
    if jax.process_count() == 1:
        return [tree]
    stacked = jax.tree.map(np.asarray, multihost_utils.process_allgather(tree))
    return [jax.tree.map(lambda leaf, p=p: leaf[p], stacked) for p in range(jax.process_count())]


def to_host(tree: Any) -> Any:
    """Every leaf as a full numpy array on every process (a collective when several run)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)

    def fetch(leaf):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            if leaf.is_fully_replicated:
                return np.asarray(leaf.addressable_data(0))
            return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        return np.asarray(leaf)

    return jax.tree.map(fetch, tree)
