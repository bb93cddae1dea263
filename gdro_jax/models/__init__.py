"""The policy model: a flax.nnx decoder (Qwen3, Llama-family, Qwen2), its config and presets,
sharding specs on a `data` x `fsdp` x `tensor` mesh, and HuggingFace folders in and out."""

from gdro_jax.models._config import SUPPORTED_ARCHITECTURES, DecoderConfig, Llama3RopeScaling
from gdro_jax.models._decoder import (
    Decoder,
    DecoderLayers,
    KVCache,
    abstract_decoder,
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
from gdro_jax.models._sharding import (
    BATCH_AXES,
    MESH_AXES,
    ShardingConfig,
    constrain,
    fit_spec,
    make_mesh,
)

__all__ = [
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
    "constrain",
    "fit_spec",
    "from_pretrained",
    "hf_tensors",
    "init_decoder",
    "load_tokenizer",
    "make_mesh",
    "parameter_shardings",
    "read_hf_config",
    "rope_inverse_frequencies",
    "save_pretrained",
]
