"""The decoder's architecture: a frozen dataclass, its presets, and the translation from and to the
`config.json` of a HuggingFace model folder (Qwen3, Llama-family and Qwen2 checkpoints)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

# HF architecture name -> (model_type, family). The family decides the flags below.
SUPPORTED_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}
_ARCHITECTURE_OF_FAMILY = {family: arch for arch, family in SUPPORTED_ARCHITECTURES.items()}
_DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")
# What a rematerialised block keeps for the backward pass (`DecoderConfig.remat_policy`).
REMAT_POLICIES = ("nothing", "dots")


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """The `rope_type: "llama3"` frequency rescaling of Llama 3.1+ checkpoints.

    References:
      Grattafiori et al., 2024, "The Llama 3 Herd of Models", arXiv 2407.21783 (long context).
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Shape and numerics of a pre-norm decoder (Qwen3 by default; Llama and Qwen2 by flags).

    Attributes:
      vocab_size: V, rows of the embedding table.
      d_model: D, width of the residual stream.
      num_layers: L, decoder blocks.
      num_heads: N, query heads.
      num_kv_heads: K, key/value heads (grouped-query attention, N % K == 0).
      head_dim: H, width of one head (Qwen3 sets it apart from D / N).
      mlp_dim: F, hidden width of the SwiGLU MLP.
      rope_theta: RoPE base wavelength.
      rope_scaling: optional Llama 3 frequency rescaling.
      rms_norm_eps: epsilon of every RMSNorm.
      tie_embeddings: the output projection reuses the embedding table.
      qk_norm: RMSNorm on each query and key head before RoPE (Qwen3).
      qkv_bias: biases on the q, k, v projections (Qwen2). Checkpoints with `attention_bias` have
        them too.
      o_bias: bias on the attention output projection (`attention_bias` checkpoints).
      mlp_bias: biases on the three MLP projections (Llama `mlp_bias`).
      max_position_embeddings: context length recorded in the checkpoint (not enforced).
      family: "qwen3", "llama" or "qwen2": which HF architecture an export writes.
      param_dtype: dtype parameters are stored in ("float32", "bfloat16" or "float16").
      compute_dtype: dtype of activations and matmuls; norms, softmax and logits stay float32.
      remat: recompute each block's activations in the backward pass (saves memory).
      remat_policy: what a rematerialised block keeps ("nothing" or "dots"). "nothing": its
        input only, and the backward pass runs the whole block's forward pass again. "dots":
        also the outputs of its seven projections (the matmuls without batch dimensions), so the
        backward pass recomputes only the norms, RoPE, attention and the SwiGLU, at the cost of
        the kept outputs' memory, `(N + 2K) H + 2D + 2F` values a token a layer.
      scan_layers: one `lax.scan` over the blocks, not an unrolled loop. Compile time is then
        independent of depth; the unrolled loop is faster on CPU, where the scan's stacked
        residual buffers cost memory traffic, and compiles in time growing with depth. The
        sampler's cached path is always unrolled.
      attention: the trainer's attention backend, "auto", "xla" or "cudnn". It serves a full
        forward pass without a KV cache (the trainer's log-probs and update): "xla" (an einsum
        and a float32 softmax, materialising the [T, S] scores of every head), "cudnn"
        (`jax.nn.dot_product_attention`'s fused cuDNN kernel: no score tensor; GPUs, bfloat16
        or float16 compute) or "auto" (cudnn where it applies, else xla). The sampler (prefill
        and decode, over the KV cache) always takes the xla path.
      bos_token_id: from config.json, kept for the round trip.
      eos_token_ids: from config.json, a convenient default stop set for the sampler.
      pad_token_id: from config.json, kept for the round trip.
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    rope_theta: float = 1_000_000.0
    rope_scaling: Llama3RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True
    qk_norm: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    max_position_embeddings: int = 40960
    family: str = "qwen3"
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat: bool = False
    remat_policy: str = "nothing"
    scan_layers: bool = True
    attention: str = "auto"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "mlp_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"DecoderConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.head_dim, int) or self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(
                f"DecoderConfig.head_dim must be a positive even int (RoPE rotates pairs), "
                f"got {self.head_dim!r}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"DecoderConfig.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if not self.rope_theta > 0:
            raise ValueError(f"DecoderConfig.rope_theta must be > 0, got {self.rope_theta!r}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"DecoderConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if self.family not in _ARCHITECTURE_OF_FAMILY:
            raise ValueError(
                f"DecoderConfig.family must be one of {sorted(_ARCHITECTURE_OF_FAMILY)}, "
                f"got {self.family!r}"
            )
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"DecoderConfig.attention must be one of {ATTENTION_IMPLEMENTATIONS}, "
                f"got {self.attention!r}"
            )
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(
                f"DecoderConfig.remat_policy must be one of {REMAT_POLICIES}, "
                f"got {self.remat_policy!r}"
            )
        for name in ("param_dtype", "compute_dtype"):
            # Accept jnp dtypes and normalise to a name so the config stays hashable and printable.
            name_of_dtype = jnp.dtype(getattr(self, name)).name
            if name_of_dtype not in _DTYPES:
                raise ValueError(
                    f"DecoderConfig.{name} must be one of {_DTYPES}, got {getattr(self, name)!r}"
                )
            object.__setattr__(self, name, name_of_dtype)
        object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))

    @property
    def num_query_groups(self) -> int:
        """G = N / K: query heads that share one key/value head."""
        return self.num_heads // self.num_kv_heads

    @property
    def architecture(self) -> str:
        """The HF architecture name an export writes (e.g. "Qwen3ForCausalLM")."""
        return _ARCHITECTURE_OF_FAMILY[self.family]

    def replace(self, **changes: Any) -> DecoderConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain values (JSON-ready apart from tuples); `from_dict` inverts it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> DecoderConfig:
        """The config of `to_dict`'s fields (lists for tuples, a dict for `rope_scaling`)."""
        fields = dict(fields)
        if isinstance(fields.get("rope_scaling"), Mapping):
            fields["rope_scaling"] = Llama3RopeScaling(**fields["rope_scaling"])
        return cls(**fields)

    # Presets: the published Qwen3 shapes (Base and post-trained checkpoints share them).

    @classmethod
    def qwen3_0p6b(cls, **overrides: Any) -> DecoderConfig:
        """Qwen3-0.6B: 28 layers, D=1024, 16/8 heads of 128, F=3072, tied embeddings."""
        return cls._qwen3(
            d_model=1024,
            num_layers=28,
            num_heads=16,
            num_kv_heads=8,
            mlp_dim=3072,
            tie_embeddings=True,
            **overrides,
        )

    @classmethod
    def qwen3_1p7b(cls, **overrides: Any) -> DecoderConfig:
        """Qwen3-1.7B: 28 layers, D=2048, 16/8 heads of 128, F=6144, tied embeddings."""
        return cls._qwen3(
            d_model=2048,
            num_layers=28,
            num_heads=16,
            num_kv_heads=8,
            mlp_dim=6144,
            tie_embeddings=True,
            **overrides,
        )

    @classmethod
    def qwen3_4b(cls, **overrides: Any) -> DecoderConfig:
        """Qwen3-4B: 36 layers, D=2560, 32/8 heads of 128, F=9728, tied embeddings."""
        return cls._qwen3(
            d_model=2560,
            num_layers=36,
            num_heads=32,
            num_kv_heads=8,
            mlp_dim=9728,
            tie_embeddings=True,
            **overrides,
        )

    @classmethod
    def qwen3_8b(cls, **overrides: Any) -> DecoderConfig:
        """Qwen3-8B: 36 layers, D=4096, 32/8 heads of 128, F=12288, untied embeddings."""
        return cls._qwen3(
            d_model=4096,
            num_layers=36,
            num_heads=32,
            num_kv_heads=8,
            mlp_dim=12288,
            tie_embeddings=False,
            **overrides,
        )

    @classmethod
    def tiny(cls, **overrides: Any) -> DecoderConfig:
        """A Qwen3-shaped toy for tests: 2 layers, D=64, 4/2 heads of 16, F=128, V=128."""
        fields = dict(
            vocab_size=128,
            d_model=64,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            mlp_dim=128,
            rope_theta=10_000.0,
            max_position_embeddings=2048,
        )
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def _qwen3(cls, **fields: Any) -> DecoderConfig:
        base = dict(
            vocab_size=151936,
            head_dim=128,
            rope_theta=1_000_000.0,
            max_position_embeddings=40960,
            eos_token_ids=(151645, 151643),
            bos_token_id=151643,
            pad_token_id=151643,
        )
        base.update(fields)
        return cls(**base)

    @classmethod
    def from_hf_config(cls, hf_config: Mapping[str, Any] | Any, **overrides: Any) -> DecoderConfig:
        """Reads a HF `config.json` (a dict or a `transformers.PretrainedConfig`).

        Accepts both config styles: `rope_theta` (+ `rope_scaling`) at top level, or the
        `rope_parameters` dict of transformers 5; `torch_dtype` or `dtype` are only validated (the
        loaded dtype is chosen by the caller).

        Args:
          hf_config: the parsed config.json.
          **overrides: DecoderConfig fields to set on top (e.g. `param_dtype`, `remat`).

        Returns:
          The DecoderConfig.

        Raises:
          ValueError: naming the field, the expected and the found value, for an architecture or
            feature this decoder does not implement (sliding windows, other activations, other
            RoPE types).
        """
        hf = dict(hf_config if isinstance(hf_config, Mapping) else hf_config.to_dict())
        family = _family_of(hf)
        if hf.get("hidden_act", "silu") != "silu":
            _unsupported("hidden_act", "'silu'", hf["hidden_act"])
        if hf.get("use_sliding_window", False):
            _unsupported("use_sliding_window", "false", hf["use_sliding_window"])
        layer_types = hf.get("layer_types") or []
        if any(t != "full_attention" for t in layer_types):
            _unsupported("layer_types", "only 'full_attention'", layer_types)
        for key in ("torch_dtype", "dtype"):
            if hf.get(key) is not None and str(hf[key]) not in _DTYPES:
                _unsupported(key, f"one of {_DTYPES}", hf[key])
        rope_theta, rope_scaling = _rope_of(hf)
        num_heads = int(hf["num_attention_heads"])
        attention_bias = bool(hf.get("attention_bias", False))
        eos = hf.get("eos_token_id")
        eos_ids = () if eos is None else (tuple(eos) if isinstance(eos, list | tuple) else (eos,))
        fields = dict(
            vocab_size=int(hf["vocab_size"]),
            d_model=int(hf["hidden_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(hf.get("head_dim") or hf["hidden_size"] // num_heads),
            mlp_dim=int(hf["intermediate_size"]),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qk_norm=family == "qwen3",
            qkv_bias=True if family == "qwen2" else attention_bias,
            o_bias=False if family == "qwen2" else attention_bias,
            mlp_bias=bool(hf.get("mlp_bias", False)) if family == "llama" else False,
            max_position_embeddings=int(hf.get("max_position_embeddings", 40960)),
            family=family,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            pad_token_id=hf.get("pad_token_id"),
        )
        fields.update(overrides)
        return cls(**fields)

    def to_hf_config(self) -> dict[str, Any]:
        """The `config.json` dict of this architecture, in the transformers 5 style."""
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope.update(rope_type="llama3", **dataclasses.asdict(self.rope_scaling))
        eos: Any = list(self.eos_token_ids)
        hf = {
            "architectures": [self.architecture],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.d_model,
            "intermediate_size": self.mlp_dim,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "pad_token_id": self.pad_token_id,
            "dtype": self.param_dtype,
            "use_cache": True,
        }
        if self.family in ("qwen3", "llama"):
            if self.qkv_bias != self.o_bias:
                raise ValueError(
                    f"family {self.family!r} has one `attention_bias` flag for q, k, v and o; "
                    f"got qkv_bias={self.qkv_bias}, o_bias={self.o_bias}"
                )
            hf["attention_bias"] = self.qkv_bias
        if self.family == "llama":
            hf["mlp_bias"] = self.mlp_bias
        expected = dict(qk_norm=self.family == "qwen3")
        if self.family == "qwen2":
            expected.update(qkv_bias=True, o_bias=False, mlp_bias=False)
        elif self.family == "qwen3":
            expected.update(mlp_bias=False)
        for name, value in expected.items():
            if getattr(self, name) != value:
                raise ValueError(
                    f"DecoderConfig.{name}={getattr(self, name)} cannot be written as family "
                    f"{self.family!r}, which requires {name}={value}"
                )
        return hf


def _unsupported(field: str, expected: str, found: Any) -> None:
    raise ValueError(f"config.json field {field!r}: expected {expected}, found {found!r}")


def _family_of(hf: Mapping[str, Any]) -> str:
    architectures = hf.get("architectures")
    if architectures:
        unknown = [a for a in architectures if a not in SUPPORTED_ARCHITECTURES]
        if unknown or len(architectures) != 1:
            _unsupported(
                "architectures", f"one of {sorted(SUPPORTED_ARCHITECTURES)}", architectures
            )
        family = SUPPORTED_ARCHITECTURES[architectures[0]]
        if hf.get("model_type", family) != family:
            _unsupported("model_type", repr(family), hf["model_type"])
        return family
    model_type = hf.get("model_type")
    if model_type not in _ARCHITECTURE_OF_FAMILY:
        _unsupported("model_type", f"one of {sorted(_ARCHITECTURE_OF_FAMILY)}", model_type)
    return model_type


def _rope_of(hf: Mapping[str, Any]) -> tuple[float, Llama3RopeScaling | None]:
    """(rope_theta, scaling) from either the `rope_parameters` or the `rope_theta` config style."""
    params = dict(hf.get("rope_parameters") or {})
    legacy_scaling = hf.get("rope_scaling")
    if not params and legacy_scaling:
        params = dict(legacy_scaling)
    theta = params.get("rope_theta", hf.get("rope_theta", 10_000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        _unsupported("rope_parameters.rope_type", "'default' or 'llama3'", rope_type)
    scaling = Llama3RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )
    return float(theta), scaling
