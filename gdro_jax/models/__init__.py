"""The policy model: a flax.nnx decoder (Qwen3, Llama-family, Qwen2), its config and presets,
sharding specs, HuggingFace folders in and out, and the mesh convention every layer above uses.

- `Decoder`, `DecoderConfig` (presets), `init_decoder`, `abstract_decoder`, `KVCache`;
  `attention_implementation`, the attention path a config takes (`ATTENTION_IMPLEMENTATIONS`);
  `REMAT_POLICIES`, what a rematerialised block keeps; `fused_attention`, the cuDNN path's call.
- `from_pretrained`, `save_pretrained`, `hf_tensors`, `load_tokenizer`; a folder that does not
  match its config raises `ModelFolderError`.
- The mesh convention: `MESH_AXES` (`data` x `fsdp` x `tensor`, Auto axes), `make_mesh`,
  `run_mesh` (None for one device), `mesh_shape`, `fit_spec`, and batches on `BATCH_AXES`
  (`batch_sharding`, `constrain_batch`); parameter placement in `ShardingConfig`.
- `memory_footprint`: parameters, AdamW moments and KV cache per device, from shapes alone.
"""

from gdro_jax.models._config import (
    ATTENTION_IMPLEMENTATIONS,
    REMAT_POLICIES,
    SUPPORTED_ARCHITECTURES,
    DecoderConfig,
    Llama3RopeScaling,
)
from gdro_jax.models._decoder import (
    Decoder,
    DecoderLayers,
    KVCache,
    abstract_decoder,
    attention_implementation,
    fused_attention,
    init_decoder,
    parameter_shardings,
    rope_inverse_frequencies,
)
from gdro_jax.models._footprint import Footprint, memory_footprint
from gdro_jax.models._hf_io import (
    MODEL_DIR,
    ModelFolderError,
    from_pretrained,
    hf_tensors,
    load_tokenizer,
    read_hf_config,
    save_pretrained,
)
from gdro_jax.models._mesh import (
    BATCH_AXES,
    MESH_AXES,
    batch_sharding,
    constrain_batch,
    fit_spec,
    make_mesh,
    mesh_shape,
    run_mesh,
)
from gdro_jax.models._sharding import ShardingConfig, constrain

__all__ = [
    "ATTENTION_IMPLEMENTATIONS",
    "REMAT_POLICIES",
    "Footprint",
    "memory_footprint",
    "BATCH_AXES",
    "MESH_AXES",
    "MODEL_DIR",
    "SUPPORTED_ARCHITECTURES",
    "Decoder",
    "DecoderConfig",
    "DecoderLayers",
    "KVCache",
    "Llama3RopeScaling",
    "ModelFolderError",
    "ShardingConfig",
    "abstract_decoder",
    "attention_implementation",
    "fused_attention",
    "batch_sharding",
    "constrain",
    "constrain_batch",
    "fit_spec",
    "from_pretrained",
    "hf_tensors",
    "init_decoder",
    "load_tokenizer",
    "make_mesh",
    "mesh_shape",
    "parameter_shardings",
    "read_hf_config",
    "rope_inverse_frequencies",
    "run_mesh",
    "save_pretrained",
]
