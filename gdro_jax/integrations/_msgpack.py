"""The host API's bytes: msgpack of nested dicts whose leaves are numpy arrays, without flax.

The encoding is the one flax's `serialization.msgpack_serialize` writes, so the controllers'
bytes saved through flax before this module (formats `gdro_jax.host/1` and `/2`) load unchanged
and the light install (jax, chex, numpy and msgpack) needs no flax:

- a NamedTuple is a map from its field names to its fields, a tuple or list a map from "0",
  "1", ... to its items, None stays None;
- an array is msgpack's extension type 1 holding the msgpack array (shape, dtype name, its
  C-order bytes); a numpy scalar is type 3, the same for its 0-d array.

Arrays over 1 GiB, which flax splits into chunks, are refused: a controllers' state is a few
arrays over the prompts and bins.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_dtypes
import msgpack
import numpy as np

_ARRAY, _SCALAR = 1, 3  # msgpack extension types
_LARGEST = 2**30  # bytes of one array (flax chunks larger ones; never so here)


def state_dict(tree: Any) -> Any:
    """`tree` (NamedTuples, tuples, lists, dicts, None and array leaves) as nested dicts of
    numpy arrays, with string keys (`jax.ShapeDtypeStruct` leaves are kept: a template)."""
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return {name: state_dict(getattr(tree, name)) for name in tree._fields}
    if isinstance(tree, tuple | list):
        return {str(i): state_dict(item) for i, item in enumerate(tree)}
    if isinstance(tree, dict):
        return {str(key): state_dict(value) for key, value in tree.items()}
    if tree is None or isinstance(
        tree, str | bool | int | float | np.generic | jax.ShapeDtypeStruct
    ):
        return tree
    return np.asarray(tree)


def from_state_dict(template: Any, loaded: Any) -> Any:
    """`loaded` (`state_dict`'s form) rebuilt in `template`'s structure; its leaves are the
    loaded arrays (check them against the template first: `HostControllers` does)."""
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        fields = {
            name: from_state_dict(getattr(template, name), loaded[name])
            for name in template._fields
        }
        return type(template)(**fields)
    if isinstance(template, tuple | list):
        return type(template)(
            from_state_dict(item, loaded[str(i)]) for i, item in enumerate(template)
        )
    if isinstance(template, dict):
        return {key: from_state_dict(value, loaded[str(key)]) for key, value in template.items()}
    return None if template is None else loaded


def _array_bytes(array: np.ndarray) -> bytes:
    if array.dtype.hasobject or array.dtype.isalignedstruct:
        raise ValueError(f"cannot write an array of dtype {array.dtype} (objects or a struct)")
    if array.nbytes > _LARGEST:
        raise ValueError(f"cannot write an array of {array.nbytes:,} bytes (at most 1 GiB)")
    return msgpack.packb((array.shape, array.dtype.name, array.tobytes("C")), use_bin_type=True)


def _array(data: bytes) -> np.ndarray:
    shape, name, buffer = msgpack.unpackb(data, raw=True)
    dtype = ml_dtypes.bfloat16 if name == b"bfloat16" else np.dtype(name.decode())
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def _pack(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return msgpack.ExtType(_ARRAY, _array_bytes(value))
    if isinstance(value, np.generic):
        return msgpack.ExtType(_SCALAR, _array_bytes(np.asarray(value)))
    raise TypeError(f"cannot write a {type(value).__name__} into the controllers' bytes")


def _unpack(code: int, data: bytes) -> Any:
    if code == _ARRAY:
        return _array(data)
    if code == _SCALAR:
        return _array(data)[()]
    return msgpack.ExtType(code, data)


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def dumps(payload: Any) -> bytes:
    """`payload` (nested dicts, lists, strings, numbers, None, numpy arrays) as msgpack bytes,
    each map's keys sorted (as flax writes them)."""
    return msgpack.packb(_sorted(payload), default=_pack, strict_types=True)


def loads(data: bytes) -> Any:
    """What `dumps` (or flax's `msgpack_serialize`, unchunked) wrote; msgpack's own errors
    where `data` is not that."""
    return msgpack.unpackb(data, ext_hook=_unpack, raw=False, strict_map_key=False)
