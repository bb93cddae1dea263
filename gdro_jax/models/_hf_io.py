"""HuggingFace model folders in and out: `config.json` plus one `*.safetensors` file or several with
a `model.safetensors.index.json`.

Loading checks the folder against the config first (every expected tensor present, none extra,
every shape right) and only then reads. Each parameter is built with
`jax.make_array_from_callback`: every device's shard is read from the files as a slice of the
stored tensors (safetensors slices are memory-mapped), so no device and no host ever holds the
whole model at once.

Over 400 lines on purpose: the tensor layout table, the dry-run checks and the sharded reader and
writer are one mapping between our parameters and HF's names, and change together.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors import safe_open
from safetensors.numpy import save_file

from gdro_jax.models._config import DecoderConfig
from gdro_jax.models._decoder import Decoder, abstract_decoder, parameter_shardings
from gdro_jax.models._sharding import ShardingConfig

CONFIG_FILE = "config.json"
# A run saves its policy as an HF folder of this name inside its work directory.
MODEL_DIR = "model"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# Our name in DecoderLayers -> (HF name after "model.layers.{i}.", layout).
_LAYER_TENSORS = {
    "attn_norm": ("input_layernorm.weight", "copy"),
    "q": ("self_attn.q_proj.weight", "heads_in"),
    "k": ("self_attn.k_proj.weight", "heads_in"),
    "v": ("self_attn.v_proj.weight", "heads_in"),
    "o": ("self_attn.o_proj.weight", "heads_out"),
    "q_norm": ("self_attn.q_norm.weight", "copy"),
    "k_norm": ("self_attn.k_norm.weight", "copy"),
    "q_bias": ("self_attn.q_proj.bias", "heads_bias"),
    "k_bias": ("self_attn.k_proj.bias", "heads_bias"),
    "v_bias": ("self_attn.v_proj.bias", "heads_bias"),
    "o_bias": ("self_attn.o_proj.bias", "copy"),
    "mlp_norm": ("post_attention_layernorm.weight", "copy"),
    "gate": ("mlp.gate_proj.weight", "transpose"),
    "up": ("mlp.up_proj.weight", "transpose"),
    "down": ("mlp.down_proj.weight", "transpose"),
    "gate_bias": ("mlp.gate_proj.bias", "copy"),
    "up_bias": ("mlp.up_proj.bias", "copy"),
    "down_bias": ("mlp.down_proj.bias", "copy"),
}
_TOP_TENSORS = {
    "embed": ("model.embed_tokens.weight", "copy"),
    "final_norm": ("model.norm.weight", "copy"),
    "lm_head": ("lm_head.weight", "transpose"),
}


class ModelFolderError(ValueError):
    """An HF model folder whose tensors do not match its `config.json`: a missing tensor, an
    unexpected one or a wrong shape. (A training run's checkpoints that cannot be restored raise
    `checkpoint.CheckpointError`.)"""


# ----------------------------------------------------------------------------------------------
# Layouts: how one of our per-layer arrays is stored as a HF tensor.
#   copy        ours == HF
#   transpose   ours [a, b]     = HF [b, a]          (nn.Linear stores [out, in])
#   heads_in    ours [D, X, H]  = HF [X*H, D]        (q/k/v projections)
#   heads_out   ours [N, H, D]  = HF [D, N*H]        (o projection)
#   heads_bias  ours [X, H]     = HF [X*H]


def _hf_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    if layout == "copy":
        return shape
    if layout == "transpose":
        return shape[::-1]
    if layout == "heads_in":
        return (shape[1] * shape[2], shape[0])
    if layout == "heads_out":
        return (shape[2], shape[0] * shape[1])
    return (shape[0] * shape[1],)


def _to_hf(array: np.ndarray, layout: str) -> np.ndarray:
    if layout == "copy":
        return array
    if layout == "transpose":
        return array.T
    if layout == "heads_in":
        return array.reshape(array.shape[0], -1).T
    if layout == "heads_out":
        return array.reshape(-1, array.shape[2]).T
    return array.reshape(-1)


def _read_block(read: Callable, index: tuple[slice, ...], shape: tuple, layout: str) -> np.ndarray:
    """Our [index] block of a per-layer array of `shape`, read from its HF tensor by `read`."""
    if layout == "copy":
        return read(index)
    if layout == "transpose":
        return read(index[::-1]).T
    head = shape[-1] if layout != "heads_out" else shape[1]
    if layout == "heads_in":
        d, x, h = index
        rows = slice(x.start * head, x.stop * head)
        block = read((rows, d)).reshape(x.stop - x.start, head, d.stop - d.start)
        return block[:, h, :].transpose(2, 0, 1)
    if layout == "heads_out":
        n, h, d = index
        cols = slice(n.start * head, n.stop * head)
        block = read((d, cols)).reshape(d.stop - d.start, n.stop - n.start, head)
        return block[:, :, h].transpose(1, 2, 0)
    x, h = index
    return read((slice(x.start * head, x.stop * head),)).reshape(x.stop - x.start, head)[:, h]


def _tensor_plan(model: Decoder) -> list[tuple[tuple[str, ...], str, int | None, str]]:
    """(our path, HF name, layer or None, layout) for every stored tensor, in HF file order."""
    state = nnx.to_pure_dict(nnx.state(model))
    plan: list[tuple[tuple[str, ...], str, int | None, str]] = [
        (("embed",), _TOP_TENSORS["embed"][0], None, "copy")
    ]
    for layer in range(model.config.num_layers):
        for name, (hf_suffix, layout) in _LAYER_TENSORS.items():
            if name in state["layers"]:
                plan.append((("layers", name), f"model.layers.{layer}.{hf_suffix}", layer, layout))
    plan.append((("final_norm",), _TOP_TENSORS["final_norm"][0], None, "copy"))
    if "lm_head" in state:
        plan.append((("lm_head",), _TOP_TENSORS["lm_head"][0], None, "transpose"))
    unplanned = (set(state) - {"embed", "final_norm", "lm_head", "layers"}) | (
        set(state["layers"]) - set(_LAYER_TENSORS)
    )
    assert not unplanned, f"parameters without a HF name: {sorted(unplanned)}"
    return plan


def _per_layer_shape(leaf: Any, layer: int | None) -> tuple[int, ...]:
    return tuple(leaf.shape[1:] if layer is not None else leaf.shape)


def _get(tree: Mapping, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


# ----------------------------------------------------------------------------------------------
# Loading.


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """The parsed `config.json` of a model folder."""
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{config_path}: no config.json in the model folder")
    with open(config_path) as f:
        return json.load(f)


def _tensor_files(path: str) -> list[str]:
    index_path = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files and no {INDEX_FILE}")
    for name in files:
        if not os.path.isfile(os.path.join(path, name)):
            raise FileNotFoundError(f"{os.path.join(path, name)}: listed in {INDEX_FILE}, absent")
    return files


def _ignorable(name: str, config: DecoderConfig) -> bool:
    # transformers itself drops these: a tied head stored anyway, and RoPE buffers of old exports.
    return (name == "lm_head.weight" and config.tie_embeddings) or name.endswith(
        "rotary_emb.inv_freq"
    )


def _check_tensors(
    expected: Mapping[str, tuple[int, ...]],
    found: Mapping[str, tuple[int, ...]],
    config: DecoderConfig,
    path: str,
) -> None:
    where = f"{path} ({config.architecture}, from config.json)"
    missing = [n for n in expected if n not in found]
    if missing:
        more = f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else ""
        raise ModelFolderError(
            f"{where}: missing tensor {missing[0]!r}: expected shape {expected[missing[0]]}, "
            f"found no such tensor{more}"
        )
    extra = [n for n in found if n not in expected and not _ignorable(n, config)]
    if extra:
        more = f" (and {len(extra) - 1} more unexpected)" if len(extra) > 1 else ""
        raise ModelFolderError(
            f"{where}: unexpected tensor {extra[0]!r}: expected no such tensor, found shape "
            f"{found[extra[0]]}{more}"
        )
    for name, shape in expected.items():
        if tuple(found[name]) != tuple(shape):
            raise ModelFolderError(
                f"{where}: tensor {name!r} has the wrong shape: expected {tuple(shape)}, "
                f"found {tuple(found[name])}"
            )


def from_pretrained(
    path: str | os.PathLike,
    *,
    dtype: Any = jnp.float32,
    compute_dtype: Any = None,
    mesh: Mesh | None = None,
    sharding: ShardingConfig | None = None,
    remat: bool = False,
    remat_policy: str = "nothing",
    scan_layers: bool = True,
    attention: str = "auto",
) -> Decoder:
    """Loads a HuggingFace Qwen3 / Llama / Qwen2 model folder into a Decoder.

    Args:
      path: folder with `config.json` and `*.safetensors` (one file, or several listed in
        `model.safetensors.index.json`).
      dtype: parameter dtype (float32, bfloat16 or float16); stored tensors are converted.
      compute_dtype: activation dtype (default: `dtype`).
      mesh: a `data` x `fsdp` x `tensor` mesh (make_mesh) to shard the parameters on, or None
        for one device.
      sharding: parameter/activation specs (default ShardingConfig()).
      remat: recompute block activations in the backward pass.
      remat_policy: what a rematerialised block keeps ("nothing" or "dots"; see DecoderConfig).
      scan_layers: run a full forward pass's blocks as one `lax.scan` (False: unrolled, faster
        on CPU; see DecoderConfig).
      attention: the attention backend of a full forward pass ("auto", "xla" or "cudnn"; see
        DecoderConfig).

    Returns:
      The Decoder, its parameters placed on their shards.

    Raises:
      ModelFolderError: for a missing tensor, an unexpected tensor or a wrong shape (naming the
        tensor, the expected and the found value); ValueError naming the config.json field for an
        unsupported architecture; FileNotFoundError for missing files.
    """
    path = os.fspath(path)
    hf_config = read_hf_config(path)
    config = DecoderConfig.from_hf_config(
        hf_config,
        param_dtype=jnp.dtype(dtype).name,
        compute_dtype=jnp.dtype(compute_dtype or dtype).name,
        remat=remat,
        remat_policy=remat_policy,
        scan_layers=scan_layers,
        attention=attention,
    )
    abstract = abstract_decoder(config, sharding=sharding, mesh=mesh)
    graphdef, abstract_state = nnx.split(abstract)
    shapes = nnx.to_pure_dict(abstract_state)
    shardings = nnx.to_pure_dict(parameter_shardings(abstract, mesh))
    plan = _tensor_plan(abstract)

    with contextlib.ExitStack() as stack:
        handles = {}
        found: dict[str, tuple[int, ...]] = {}
        for file_name in _tensor_files(path):
            handle = stack.enter_context(safe_open(os.path.join(path, file_name), "numpy"))
            for name in handle.keys():
                handles[name] = handle
                found[name] = tuple(handle.get_slice(name).get_shape())
        expected = {
            hf_name: _hf_shape(_per_layer_shape(_get(shapes, p), layer), layout)
            for p, hf_name, layer, layout in plan
        }
        _check_tensors(expected, found, config, path)

        hf_names: dict[tuple[str, ...], list[str]] = {}
        layouts: dict[tuple[str, ...], str] = {}
        for our_path, hf_name, _, layout in plan:
            hf_names.setdefault(our_path, []).append(hf_name)
            layouts[our_path] = layout
        arrays: dict[tuple[str, ...], jax.Array] = {}
        for our_path, names in hf_names.items():
            leaf = _get(shapes, our_path)
            arrays[our_path] = _load_parameter(
                handles,
                names,
                layouts[our_path],
                tuple(leaf.shape),
                leaf.dtype,
                _get(shardings, our_path),
                stacked=our_path[0] == "layers",
            )

    values = {"layers": {}}
    for our_path, array in arrays.items():
        (values["layers"] if our_path[0] == "layers" else values)[our_path[-1]] = array
    nnx.replace_by_pure_dict(abstract_state, values)
    return nnx.merge(graphdef, abstract_state)


def _load_parameter(handles, names, layout, shape, dtype, sharding, *, stacked):
    """One parameter, built shard by shard from the stored tensors `names` (one per layer)."""
    per_layer_shape = shape[1:] if stacked else shape
    blocks: dict[tuple, np.ndarray] = {}  # replicated shards are read once

    def reader(name):
        tensor = handles[name].get_slice(name)
        return lambda hf_index: np.asarray(tensor[hf_index])

    def callback(index):
        index = tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape, strict=True))
        key = tuple((s.start, s.stop) for s in index)
        if key not in blocks:
            if stacked:
                layer_block = [
                    _read_block(reader(names[i]), index[1:], per_layer_shape, layout)
                    for i in range(index[0].start, index[0].stop)
                ]
                block = np.stack(layer_block)
            else:
                block = _read_block(reader(names[0]), index, per_layer_shape, layout)
            blocks[key] = np.ascontiguousarray(block.astype(dtype))
        return blocks[key]

    return jax.make_array_from_callback(shape, sharding, callback)


# ----------------------------------------------------------------------------------------------
# Export.


def hf_tensors(
    model: Decoder, convert: Callable[[jax.Array], Any] = lambda leaf: np.asarray(leaf)
) -> Iterator[tuple[str, Any]]:
    """`(HF name, tensor)` of every tensor an export writes, in HF file order: the weights an
    inference engine that loads HF checkpoints (vLLM) takes, without a file in between.

    Args:
      model: the Decoder.
      convert: turns one parameter (all layers of a stacked one) into the array type wanted,
        once per parameter: default a host numpy array; `torch.from_dlpack` hands a
        single-device JAX array to torch without a copy. The layouts only transpose, reshape
        and index, which numpy and torch arrays share, so the tensors are views of it.
    """
    state = nnx.to_pure_dict(nnx.state(model))
    converted: dict[tuple[str, ...], Any] = {}
    for our_path, hf_name, layer, layout in _tensor_plan(model):
        if our_path not in converted:
            converted[our_path] = convert(_get(state, our_path))
        whole = converted[our_path]
        yield hf_name, _to_hf(whole if layer is None else whole[layer], layout)


def save_pretrained(
    model: Decoder,
    path: str | os.PathLike,
    *,
    max_shard_bytes: int = 5 * 1024**3,
    tokenizer: Any = None,
) -> None:
    """Writes `model` as a HuggingFace folder that `transformers.AutoModelForCausalLM` loads.

    Earlier `model*.safetensors` files and index in `path` are removed first. Tensors are written
    in the parameter dtype, layer by layer (one layer's tensor on the host at a
    time). Over `max_shard_bytes` the tensors are split into `model-0000i-of-0000n.safetensors`
    files with a `model.safetensors.index.json`, as transformers does.

    Args:
      model: the Decoder.
      path: the folder (created if needed).
      max_shard_bytes: largest size of one safetensors file.
      tokenizer: optional transformers tokenizer, saved alongside.
    """
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):  # stale tensor files of an earlier export would be read back
        if name == INDEX_FILE or (name.startswith("model") and name.endswith(".safetensors")):
            os.remove(os.path.join(path, name))
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(model.config.to_hf_config(), f, indent=2)
    state = nnx.to_pure_dict(nnx.state(model))
    plan = _tensor_plan(model)
    shards: list[list[tuple]] = [[]]
    shard_bytes = 0
    total_bytes = 0
    for entry in plan:
        leaf = _get(state, entry[0])
        nbytes = int(np.prod(_per_layer_shape(leaf, entry[2]))) * leaf.dtype.itemsize
        if shards[-1] and shard_bytes + nbytes > max_shard_bytes:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(entry)
        shard_bytes += nbytes
        total_bytes += nbytes
    count = len(shards)
    file_names = (
        [SINGLE_FILE]
        if count == 1
        else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
    )
    weight_map = {}
    for file_name, entries in zip(file_names, shards, strict=True):
        tensors = {}
        for our_path, hf_name, layer, layout in entries:
            leaf = _get(state, our_path)
            host = np.asarray(jax.device_get(leaf if layer is None else leaf[layer]))
            tensors[hf_name] = np.ascontiguousarray(_to_hf(host, layout))
            weight_map[hf_name] = file_name
        save_file(tensors, os.path.join(path, file_name), metadata={"format": "pt"})
    if count > 1:
        index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
        with open(os.path.join(path, INDEX_FILE), "w") as f:
            json.dump(index, f, indent=2)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer of a local folder, through `transformers.AutoTokenizer`.

    Raises:
      FileNotFoundError: the folder does not exist.
      ValueError: it holds no usable tokenizer (naming the folder and the files expected).
    """
    from transformers import AutoTokenizer  # noqa: PLC0415 (heavy; only some callers need it)

    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer folder {path!r} does not exist")
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"no usable tokenizer in {path!r} (expected tokenizer.json / tokenizer_config.json): "
            f"{error}"
        ) from error
