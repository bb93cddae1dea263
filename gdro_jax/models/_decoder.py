"""The decoder in flax.nnx: Qwen3 (QK-norm, GQA, RoPE, SwiGLU, RMSNorm, no biases) and, by config
flags, Llama-family and Qwen2 checkpoints.

The L blocks keep their parameters stacked on a leading layer axis. Training (a full causal
forward over padded sequences) runs them as one `lax.scan` by default, so its compile time does
not grow with depth; `DecoderConfig.scan_layers=False` unrolls them instead, which is faster on
CPU (the scan's stacked per-layer residual buffers are zero-filled and sliced every step).
Sampling (writing new keys/values into a preallocated KV cache) runs them as an unrolled Python
loop over per-layer caches: inside the sampler's decode loop every layer's weights are then
loop-invariant slices that XLA hoists out of the loop, and each layer's cache is its own buffer,
updated in place and read by attention without a copy (a scan would slice weights and cache out
of the stacked arrays at every step).

Numerics follow HuggingFace transformers: RMSNorm and the attention softmax in float32, RoPE by
rotating halves of each head, heads of one key/value group contiguous (query head n uses key/value
head n // G).

Over 400 lines on purpose: the whole Qwen3 decoder (attention, MLP, layers, KV cache) reads top to
bottom in one file, as in the flax gemma example.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from gdro_jax.models._config import DecoderConfig
from gdro_jax.models._mesh import check_mesh
from gdro_jax.models._sharding import ShardingConfig, constrain, state_shardings

# `DecoderConfig.remat_policy` -> what `jax.checkpoint` keeps of a block. `_dense` flattens its
# rows, so the seven projections are matmuls without batch dimensions, and the attention's
# einsums (batched over B and K) are not kept.
_REMAT_POLICY = {
    "nothing": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
_INIT_STD = 0.02  # transformers' `initializer_range` default for these families
# A finite "minus infinity": a query whose keys are all masked (a pad row) gets a uniform softmax
# instead of NaNs, which would otherwise leak into gradients through the masked-out rows.
_MASKED = -0.7 * float(np.finfo(np.float32).max)


class KVCache(NamedTuple):
    """Keys and values of all layers for a batch of sequences, indexed by cache slot (each
    layer's may also be a tuple of blocks along the slots: `Decoder.extend_cache`)."""

    # Keys are stored transposed, [H, S] per head, so that the score matmul q @ k reads them in
    # the layout a matmul wants (a [S, H] key cache is repacked at every decode step).
    k: tuple[jax.Array, ...]  # L x [B, K, H, S] compute dtype, keys after QK-norm and RoPE
    v: tuple[jax.Array, ...]  # L x [B, K, S, H] compute dtype


def rope_inverse_frequencies(config: DecoderConfig) -> np.ndarray:
    """The H/2 RoPE inverse frequencies, float32, computed as transformers does.

    References:
      Su et al., 2021, "RoFormer", arXiv 2104.09864, eq. 34; Llama 3 rescaling: Grattafiori et
      al., 2024, arXiv 2407.21783.
    """
    dim = config.head_dim
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    inv_freq = (np.float32(1.0) / np.power(np.float32(config.rope_theta), exponents)).astype(
        np.float32
    )
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return normed.astype(x.dtype) * scale.astype(x.dtype)


def _apply_rope(x_BTXH: jax.Array, cos_BTh: jax.Array, sin_BTh: jax.Array) -> jax.Array:
    half = x_BTXH.shape[-1] // 2
    x1, x2 = x_BTXH[..., :half], x_BTXH[..., half:]
    cos = cos_BTh[:, :, None, :].astype(x_BTXH.dtype)
    sin = sin_BTh[:, :, None, :].astype(x_BTXH.dtype)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _dense(x: jax.Array, w: jax.Array, contract: int) -> jax.Array:
    """Contracts the last `contract` dims of x with the first of w, as one 2-D matmul.

    Leading dims are flattened into rows first: XLA:CPU runs the backward pass of a 2-D matmul
    (weight gradient x^T @ dy) markedly faster than that of the batched-einsum form, whose weight
    gradient contracts over two dimensions.
    """
    rows = x.shape[: x.ndim - contract]
    inner = math.prod(x.shape[x.ndim - contract :])
    y = x.reshape(-1, inner) @ w.reshape(inner, -1)
    return y.reshape(*rows, *w.shape[contract:])


def _attention(q_BTNH, k_BKHS, v_BKSH, allowed_BTS, live_n=None):
    """Grouped-query attention: query head n reads key/value head n // G.

    Queries are laid out [B, K, G*T, H] so both matmuls are batched over (B, K) with one free and
    one contracting dimension each (forward and backward), without relayout copies of the keys.
    Keys and values may come as tuples of blocks along S (a blocked cache): each block is read
    where it lies, with a softmax of its own, and the blocks are joined by their maxima
    (`_attention_over_live_blocks`; no scores are concatenated or sliced). `live_n` ([n] bool, one
    per block, or None: all read): the blocks to read.
    """
    k_blocks = k_BKHS if isinstance(k_BKHS, tuple) else (k_BKHS,)
    v_blocks = v_BKSH if isinstance(v_BKSH, tuple) else (v_BKSH,)
    B, T, N, H = q_BTNH.shape
    K, S = k_blocks[0].shape[1], sum(k.shape[3] for k in k_blocks)
    G = N // K
    q_BKQH = q_BTNH.reshape(B, T, K, G, H).transpose(0, 2, 3, 1, 4).reshape(B, K, G * T, H)
    if live_n is not None or len(k_blocks) > 1:
        attn_BKQH = _attention_over_live_blocks(q_BKQH, k_blocks, v_blocks, allowed_BTS, live_n, G)
        return attn_BKQH.reshape(B, K, G, T, H).transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)
    (k_BKHS,), (v_BKSH,) = k_blocks, v_blocks
    scores_BKQS = jnp.einsum("bkqh,bkhs->bkqs", q_BKQH, k_BKHS, preferred_element_type=jnp.float32)
    scores_BKGTS = scores_BKQS.reshape(B, K, G, T, S) * (H**-0.5)
    scores_BKGTS = jnp.where(allowed_BTS[:, None, None], scores_BKGTS, _MASKED)
    probs_BKQS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(q_BTNH.dtype).reshape(B, K, G * T, S)
    attn_BKQH = jnp.einsum("bkqs,bksh->bkqh", probs_BKQS, v_BKSH)
    return attn_BKQH.reshape(B, K, G, T, H).transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)


def _attention_over_live_blocks(q_BKQH, k_blocks, v_blocks, allowed_BTS, live_n, G):
    """Attention over the blocks marked live only: block i is read (`lax.cond`) only where
    `live_n[i]`, and its slots must then be masked by `allowed_BTS` for every query that counts.
    `live_n` None: every block is read (no conds).

    Each live block gives its scores' maximum, the sum of their exponentials and the values
    weighted by them; the blocks are joined by their maxima (flash-decoding's merge), so nothing
    of a step's work (scores, softmax, values) grows with the blocks skipped. A skipped block
    stands for scores all masked: the maximum `_MASKED`, nothing summed.
    """
    B, K, Q, H = q_BKQH.shape
    T = Q // G
    parts, start = [], 0
    for i, (k, v) in enumerate(zip(k_blocks, v_blocks, strict=True)):
        size = k.shape[3]
        allowed_BKQs = jnp.broadcast_to(
            allowed_BTS[:, None, None, :, start : start + size], (B, K, G, T, size)
        ).reshape(B, K, Q, size)

        def block(k=k, v=v, allowed_BKQs=allowed_BKQs):
            scores = jnp.einsum("bkqh,bkhs->bkqs", q_BKQH, k, preferred_element_type=jnp.float32)
            scores = jnp.where(allowed_BKQs, scores * (H**-0.5), _MASKED)
            peak = jnp.max(scores, axis=-1, keepdims=True)
            weights = jnp.exp(scores - peak)
            values = jnp.einsum(
                "bkqs,bksh->bkqh", weights.astype(v.dtype), v, preferred_element_type=jnp.float32
            )
            return peak, jnp.sum(weights, axis=-1, keepdims=True), values

        def skipped():
            return (
                jnp.full((B, K, Q, 1), _MASKED, jnp.float32),
                jnp.zeros((B, K, Q, 1), jnp.float32),
                jnp.zeros((B, K, Q, H), jnp.float32),
            )

        parts.append(block() if live_n is None else jax.lax.cond(live_n[i], block, skipped))
        start += size
    peak = functools.reduce(jnp.maximum, (p for p, _, _ in parts))
    scale = [jnp.exp(p - peak) for p, _, _ in parts]
    total = sum(s * w for s, (_, w, _) in zip(scale, parts, strict=True))
    values = sum(s * o for s, (_, _, o) in zip(scale, parts, strict=True))
    return (values / total).astype(q_BKQH.dtype)


def cache_slots(entry: jax.Array | tuple[jax.Array, ...], axis: int) -> int:
    """The slots of one layer's keys or values (`axis`: 3 for keys, 2 for values), blocked or
    not."""
    blocks = entry if isinstance(entry, tuple) else (entry,)
    return sum(block.shape[axis] for block in blocks)


def _write_cache(cache: jax.Array, new: jax.Array, index: jax.Array | int, axis: int):
    """`cache` with `new` written along `axis` from slot `index`, the same for the whole batch
    (one in-place write)."""
    return jax.lax.dynamic_update_slice_in_dim(cache, new, index, axis)


def _write_blocks(blocks, new, index, axis: int):
    """A blocked cache with `new` (T slots along `axis`) written from slot `index` of the blocks
    joined, into the one block that holds those slots: every block takes an in-place write at
    its clamped offset, of `new` where the slots are its own and of its own slots elsewhere."""
    T, written, offset = new.shape[axis], [], 0
    for block in blocks:
        size = block.shape[axis]
        local = jnp.clip(index - offset, 0, size - T)
        held = (index >= offset) & (index + T <= offset + size)
        own = jax.lax.dynamic_slice_in_dim(block, local, T, axis)
        written.append(_write_cache(block, jnp.where(held, new, own), local, axis))
        offset += size
    return tuple(written)


def attention_implementation(config: DecoderConfig, platform: str | None = None) -> str:
    """The path a full forward pass's attention takes: "cudnn" or "xla".

    "auto" resolves to cuDNN's fused kernel on GPUs with bfloat16 or float16 compute (the kernel
    takes no float32), else to XLA. `platform`: the devices' ("gpu", "tpu", "cpu"), the
    model's mesh's when it has one; default jax's default backend.
    """
    if config.attention != "auto":
        return config.attention
    platform = platform or jax.default_backend()
    fused = platform in ("gpu", "cuda") and config.compute_dtype in ("bfloat16", "float16")
    return "cudnn" if fused else "xla"


def fused_attention(q_BTNH, k_BTKH, v_BTKH, allowed_BTS, implementation="cudnn", causal=True):
    """A full forward pass's attention through `jax.nn.dot_product_attention`'s cuDNN kernel
    (`DecoderConfig.attention="cudnn"`): the mask (causal within a segment, real keys) goes in
    as one [B, 1, T, S] boolean, broadcast over heads, and no [B, N, T, S] score tensor is
    materialised.

    Only a full forward pass comes here (T = S, query t at slot t), whose mask is already causal,
    so `is_causal` (`causal`) changes no value: it tells the kernel that the tiles above the
    diagonal are all masked, and it skips them, about half the scores' work. `causal=False` (the
    accelerator benchmark's comparison) and `implementation="xla"` (the tests', on any device)
    leave the rest of the call as the model makes it.
    """
    return jax.nn.dot_product_attention(
        q_BTNH,
        k_BTKH,
        v_BTKH,
        mask=allowed_BTS[:, None],
        is_causal=causal,
        implementation=implementation,
    )


def _param(value: jax.Array, spec: P, dtype: str) -> nnx.Param:
    # Placement is ours (jit out_shardings / make_array_from_callback), not flax's eager sharding.
    return nnx.Param(value.astype(dtype), out_sharding=spec, eager_sharding=False)


class DecoderLayers(nnx.Module):
    """All L decoder blocks; every parameter has a leading layer axis [L, ...].

    `apply_layer` runs one block and is called inside the layer scan on a module merged from one
    layer's slice of these parameters.
    """

    def __init__(self, config: DecoderConfig, sharding: ShardingConfig, *, rngs: nnx.Rngs):
        c, s = config, sharding
        L, D, N, K, H, F = (
            c.num_layers,
            c.d_model,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.mlp_dim,
        )
        dtype = c.param_dtype

        def normal(shape, spec):
            value = _INIT_STD * jax.random.normal(rngs.params(), (L, *shape), jnp.float32)
            return _param(value, P(None, *spec), dtype)

        def const(shape, spec, fill):
            return _param(jnp.full((L, *shape), fill, jnp.float32), P(None, *spec), dtype)

        self.attn_norm = const((D,), s.norm_d, 1.0)
        self.q = normal((D, N, H), s.q_dnh)
        self.k = normal((D, K, H), s.kv_dkh)
        self.v = normal((D, K, H), s.kv_dkh)
        self.o = normal((N, H, D), s.o_nhd)
        if c.qk_norm:
            self.q_norm = const((H,), s.head_norm_h, 1.0)
            self.k_norm = const((H,), s.head_norm_h, 1.0)
        if c.qkv_bias:
            self.q_bias = const((N, H), s.q_bias_nh, 0.0)
            self.k_bias = const((K, H), s.kv_bias_kh, 0.0)
            self.v_bias = const((K, H), s.kv_bias_kh, 0.0)
        if c.o_bias:
            self.o_bias = const((D,), s.bias_d, 0.0)
        self.mlp_norm = const((D,), s.norm_d, 1.0)
        self.gate = normal((D, F), s.mlp_in_df)
        self.up = normal((D, F), s.mlp_in_df)
        self.down = normal((F, D), s.mlp_out_fd)
        if c.mlp_bias:
            self.gate_bias = const((F,), s.mlp_bias_f, 0.0)
            self.up_bias = const((F,), s.mlp_bias_f, 0.0)
            self.down_bias = const((D,), s.bias_d, 0.0)

    def apply_layer(
        self,
        x_BTD: jax.Array,
        *,
        config: DecoderConfig,
        sharding: ShardingConfig,
        mesh: Mesh | None,
        cos_BTh: jax.Array,
        sin_BTh: jax.Array,
        allowed_BTS: jax.Array,
        cache: tuple[jax.Array, jax.Array] | None,
        cache_index: jax.Array | int,
        live_blocks: jax.Array | bool | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """One pre-norm block on one layer's parameters (call on a per-layer slice).

        Args:
          x_BTD: residual stream.
          config: the architecture.
          sharding: activation specs.
          mesh: the mesh, or None (no constraints).
          cos_BTh: RoPE cosines [B, T, H/2] float32.
          sin_BTh: RoPE sines [B, T, H/2] float32.
          allowed_BTS: whether query t may attend key slot s.
          cache: this layer's (keys [B, K, H, S], values [B, K, S, H]), or None to attend only
            within this call's tokens.
          cache_index: cache slot of this call's first token (one for the whole batch).
          live_blocks: for a blocked cache, [n] bool: which blocks attention reads, the new
            keys/values going into the block that holds `cache_index` (see
            `Decoder.extend_cache`); True: the same write, every block read; None: every block
            read, the new ones written into the last.

        Returns:
          (the new residual stream [B, T, D], this layer's cache with the new keys/values
          written, or None).
        """
        c, s = config, sharding
        cdt = jnp.dtype(c.compute_dtype)

        h_BTD = _rms_norm(x_BTD, self.attn_norm[...], c.rms_norm_eps)
        q_BTNH = _dense(h_BTD, self.q[...].astype(cdt), 1)
        k_BTKH = _dense(h_BTD, self.k[...].astype(cdt), 1)
        v_BTKH = _dense(h_BTD, self.v[...].astype(cdt), 1)
        if c.qkv_bias:
            q_BTNH = q_BTNH + self.q_bias[...].astype(cdt)
            k_BTKH = k_BTKH + self.k_bias[...].astype(cdt)
            v_BTKH = v_BTKH + self.v_bias[...].astype(cdt)
        if c.qk_norm:
            q_BTNH = _rms_norm(q_BTNH, self.q_norm[...], c.rms_norm_eps)
            k_BTKH = _rms_norm(k_BTKH, self.k_norm[...], c.rms_norm_eps)
        q_BTNH = constrain(_apply_rope(q_BTNH, cos_BTh, sin_BTh), s.act_btnh, mesh)
        k_BTKH = constrain(_apply_rope(k_BTKH, cos_BTh, sin_BTh), s.act_btkh, mesh)
        v_BTKH = constrain(v_BTKH, s.act_btkh, mesh)

        k_BKHT = k_BTKH.transpose(0, 2, 3, 1)
        v_BKTH = v_BTKH.transpose(0, 2, 1, 3)
        if cache is None:
            k_BKHS, v_BKSH = k_BKHT, v_BKTH
        elif isinstance(cache[0], tuple) and live_blocks is not None:  # into the holding block
            k_blocks, v_blocks = cache
            k_new = _write_blocks(k_blocks, k_BKHT.astype(k_blocks[0].dtype), cache_index, 3)
            v_new = _write_blocks(v_blocks, v_BKTH.astype(v_blocks[0].dtype), cache_index, 2)
            cache = (
                tuple(constrain(k, s.cache_bkhs, mesh) for k in k_new),
                tuple(constrain(v, s.cache_bksh, mesh) for v in v_new),
            )
            k_BKHS, v_BKSH = cache
        elif isinstance(cache[0], tuple):  # blocks along S: this call writes into the last
            k_blocks, v_blocks = cache
            index = cache_index - cache_slots(k_blocks[:-1], 3)
            k_last = _write_cache(k_blocks[-1], k_BKHT.astype(k_blocks[-1].dtype), index, axis=3)
            v_last = _write_cache(v_blocks[-1], v_BKTH.astype(v_blocks[-1].dtype), index, axis=2)
            cache = (
                (*k_blocks[:-1], constrain(k_last, s.cache_bkhs, mesh)),
                (*v_blocks[:-1], constrain(v_last, s.cache_bksh, mesh)),
            )
            k_BKHS, v_BKSH = cache
        else:
            k_BKHS = _write_cache(cache[0], k_BKHT.astype(cache[0].dtype), cache_index, axis=3)
            v_BKSH = _write_cache(cache[1], v_BKTH.astype(cache[1].dtype), cache_index, axis=2)
            cache = (constrain(k_BKHS, s.cache_bkhs, mesh), constrain(v_BKSH, s.cache_bksh, mesh))
            k_BKHS, v_BKSH = cache

        platform = None if mesh is None else mesh.devices.flat[0].platform
        if cache is None and attention_implementation(c, platform) == "cudnn":
            attn_BTNH = fused_attention(q_BTNH, k_BTKH, v_BTKH, allowed_BTS)
        else:
            live_n = None if live_blocks is True else live_blocks
            attn_BTNH = _attention(q_BTNH, k_BKHS, v_BKSH, allowed_BTS, live_n)
        attn_BTNH = constrain(attn_BTNH, s.act_btnh, mesh)
        out_BTD = _dense(attn_BTNH, self.o[...].astype(cdt), 2)
        if c.o_bias:
            out_BTD = out_BTD + self.o_bias[...].astype(cdt)
        x_BTD = constrain(x_BTD + out_BTD, s.act_btd, mesh)

        h_BTD = _rms_norm(x_BTD, self.mlp_norm[...], c.rms_norm_eps)
        gate_BTF = _dense(h_BTD, self.gate[...].astype(cdt), 1)
        up_BTF = _dense(h_BTD, self.up[...].astype(cdt), 1)
        if c.mlp_bias:
            gate_BTF = gate_BTF + self.gate_bias[...].astype(cdt)
            up_BTF = up_BTF + self.up_bias[...].astype(cdt)
        act_BTF = constrain(jax.nn.silu(gate_BTF) * up_BTF, s.act_btf, mesh)
        mlp_BTD = _dense(act_BTF, self.down[...].astype(cdt), 1)
        if c.mlp_bias:
            mlp_BTD = mlp_BTD + self.down_bias[...].astype(cdt)
        return constrain(x_BTD + mlp_BTD, s.act_btd, mesh), cache


class Decoder(nnx.Module):
    """A causal language model: embedding, L decoder blocks, final RMSNorm, output projection.

    Call it as `model(tokens_BT, positions_BT, attention_mask_BT) -> logits_BTV` (float32).
    Attention is causal by array index and skips keys whose `attention_mask_BT` is False, so a
    batch may be left- or right-padded; `positions_BT` are the RoPE positions (0 at each
    sequence's first real token). The sampler uses `extend_cache` and `logits` instead.

    Attributes:
      config: the DecoderConfig.
      sharding: the ShardingConfig of parameters and activations.
      mesh: the mesh parameters live on, or None for one device. With a mesh, activations are
        constrained to `sharding`'s specs inside every call.
    """

    def __init__(
        self,
        config: DecoderConfig,
        *,
        rngs: nnx.Rngs,
        sharding: ShardingConfig | None = None,
        mesh: Mesh | None = None,
    ):
        if mesh is not None:
            check_mesh(mesh)
        self.config = config
        self.sharding = sharding = sharding or ShardingConfig()
        self.mesh = mesh
        c = config
        embed = _INIT_STD * jax.random.normal(rngs.params(), (c.vocab_size, c.d_model))
        self.embed = _param(embed, sharding.emb_vd, c.param_dtype)
        self.layers = DecoderLayers(config, sharding, rngs=rngs)
        self.final_norm = _param(jnp.ones((c.d_model,)), sharding.norm_d, c.param_dtype)
        if not c.tie_embeddings:
            head = _INIT_STD * jax.random.normal(rngs.params(), (c.d_model, c.vocab_size))
            self.lm_head = _param(head, sharding.unemb_dv, c.param_dtype)

    def __call__(
        self,
        tokens_BT: jax.Array,
        positions_BT: jax.Array,
        attention_mask_BT: jax.Array | None = None,
    ) -> jax.Array:
        """Logits of the next token at every position.

        Args:
          tokens_BT: token ids, int.
          positions_BT: RoPE positions, int.
          attention_mask_BT: True for real tokens (None: all real).

        Returns:
          logits_BTV, float32. Rows of padding tokens are finite but meaningless.
        """
        return self.logits(self.hidden_states(tokens_BT, positions_BT, attention_mask_BT))

    def hidden_states(
        self,
        tokens_BT: jax.Array,
        positions_BT: jax.Array,
        attention_mask_BT: jax.Array | None = None,
        *,
        segment_ids_BT: jax.Array | None = None,
    ) -> jax.Array:
        """The final-normed hidden states h_BTD (inputs of the output projection).

        `segment_ids_BT` (packed rows): a query attends only to keys of its own segment."""
        B, T = tokens_BT.shape
        mask_BT = jnp.ones((B, T), bool) if attention_mask_BT is None else attention_mask_BT
        index_T = jnp.arange(T)
        allowed_BTS = mask_BT.astype(bool)[:, None, :] & (index_T[None, :] <= index_T[:, None])
        if segment_ids_BT is not None:
            allowed_BTS &= segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :]
        h_BTD, _ = self._run(tokens_BT, positions_BT, allowed_BTS, cache=None, cache_index=0)
        return h_BTD

    def extend_cache(
        self,
        tokens_BT: jax.Array,
        positions_BT: jax.Array,
        *,
        cache: KVCache,
        cache_index: jax.Array | int,
        key_mask_BS: jax.Array,
        layers: Sequence[DecoderLayers] | None = None,
        causal_by_slot: bool = True,
        live_blocks: jax.Array | bool | None = None,
    ) -> tuple[jax.Array, KVCache]:
        """Runs T new tokens per sequence, writing their keys/values at cache slots
        `cache_index .. cache_index+T-1`, and attending to every earlier valid slot.

        Args:
          tokens_BT: the new token ids.
          positions_BT: their RoPE positions.
          cache: the KV cache (S slots). Each layer's keys and values may be tuples of blocks
            along S (a blocked cache: attention reads the blocks given, and the new tokens go
            into the last one); pass the live blocks only, so that a step reads no more.
          cache_index: slot of the first new token, the same for the whole batch (the
            continuous sampler's lanes, at different steps, write one ring slot together).
          key_mask_BS: False for slots that never hold a real token (padding).
          layers: the result of `layer_slices()`, computed once outside a decode loop (optional;
            otherwise every layer's weights are sliced from the stacked arrays here).
          causal_by_slot: a query attends to no slot after its own (True), or `key_mask_BS`
            alone says which slots it reads (False: a cache whose slots are not in token
            order, such as the continuous sampler's ring of completion slots).
          live_blocks: for a blocked cache, [n] bool, one per block: attention reads only the
            blocks marked True (the others' slots must be masked by `key_mask_BS` for every row
            that counts), and the new tokens go into whichever block holds `cache_index` (a
            ring of blocks; the T new slots within one block), each unmarked block skipped by a
            `lax.cond`. True: the same write, and every block read (no conds; the slots not to
            be read masked by `key_mask_BS`). None: every block given is read and the new tokens
            go into the last.

        Returns:
          (h_BTD final-normed hidden states, the updated cache).
        """
        T = tokens_BT.shape[1]
        S = cache_slots(cache.v[0], 2)
        allowed_BTS = jnp.broadcast_to(
            key_mask_BS.astype(bool)[:, None, :], (len(key_mask_BS), T, S)
        )
        if jnp.ndim(cache_index) != 0:
            raise ValueError(
                f"cache_index must be one slot for the whole batch, got shape "
                f"{jnp.shape(cache_index)}"
            )
        if causal_by_slot:
            query_slot_T = cache_index + jnp.arange(T)
            allowed_BTS &= jnp.arange(S) <= query_slot_T[:, None]
        return self._run(
            tokens_BT,
            positions_BT,
            allowed_BTS,
            cache=cache,
            cache_index=cache_index,
            layers=layers,
            live_blocks=live_blocks,
        )

    def layer_slices(self) -> tuple[DecoderLayers, ...]:
        """Each layer's parameters as its own module (slices of the stacked [L, ...] arrays).

        Inside a jitted decode loop, slice once before the loop and pass the result to
        `extend_cache`: XLA does not hoist the per-step weight slices out of the loop itself.
        """
        graphdef, state = nnx.split(self.layers)
        return tuple(
            nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))
            for i in range(self.config.num_layers)
        )

    def logits(self, h_BTD: jax.Array) -> jax.Array:
        """The output projection: logits_BTV in float32."""
        cdt = jnp.dtype(self.config.compute_dtype)
        if self.config.tie_embeddings:
            logits = _dense(h_BTD, self.embed[...].astype(cdt).T, 1)
        else:
            logits = _dense(h_BTD, self.lm_head[...].astype(cdt), 1)
        return constrain(logits.astype(jnp.float32), self.sharding.logits_btv, self.mesh)

    def init_cache(self, batch: int, length: int) -> KVCache:
        """A zero KV cache for `batch` sequences of `length` slots, in the compute dtype."""
        c, s = self.config, self.sharding
        K, H = c.num_kv_heads, c.head_dim

        def zeros(shape, spec):
            return constrain(jnp.zeros(shape, c.compute_dtype), spec, self.mesh)

        return KVCache(
            k=tuple(zeros((batch, K, H, length), s.cache_bkhs) for _ in range(c.num_layers)),
            v=tuple(zeros((batch, K, length, H), s.cache_bksh) for _ in range(c.num_layers)),
        )

    def _run(
        self, tokens_BT, positions_BT, allowed_BTS, *, cache, cache_index, layers=None,
        live_blocks=None,
    ):  # fmt: skip
        c, s, mesh = self.config, self.sharding, self.mesh
        cdt = jnp.dtype(c.compute_dtype)
        tokens_BT = constrain(tokens_BT, s.tokens_bt, mesh)
        table_VD = constrain(self.embed[...], s.emb_lookup_vd, mesh)
        x_BTD = jnp.take(table_VD, tokens_BT, axis=0).astype(cdt)
        x_BTD = constrain(x_BTD, s.act_btd, mesh)
        angles_BTh = positions_BT.astype(jnp.float32)[..., None] * rope_inverse_frequencies(c)
        cos_BTh, sin_BTh = jnp.cos(angles_BTh), jnp.sin(angles_BTh)

        graphdef, layer_state = nnx.split(self.layers)
        apply = functools.partial(
            DecoderLayers.apply_layer,
            config=c,
            sharding=s,
            mesh=mesh,
            cos_BTh=cos_BTh,
            sin_BTh=sin_BTh,
            allowed_BTS=allowed_BTS,
            cache_index=cache_index,
            live_blocks=live_blocks,
        )
        if cache is None:

            def block(x_BTD, params):
                return apply(nnx.merge(graphdef, params), x_BTD, cache=None)[0]

            if c.remat:
                block = jax.checkpoint(block, policy=_REMAT_POLICY[c.remat_policy])
            if c.scan_layers:
                x_BTD, _ = jax.lax.scan(lambda x, p: (block(x, p), None), x_BTD, layer_state)
            else:
                for layer in range(c.num_layers):
                    x_BTD = block(x_BTD, jax.tree.map(lambda a, i=layer: a[i], layer_state))
        else:
            keys, values = [], []
            for layer, block in enumerate(layers or self.layer_slices()):
                x_BTD, (k, v) = apply(block, x_BTD, cache=(cache.k[layer], cache.v[layer]))
                keys.append(k)
                values.append(v)
            cache = KVCache(k=tuple(keys), v=tuple(values))
        return _rms_norm(x_BTD, self.final_norm[...], c.rms_norm_eps), cache


def abstract_decoder(
    config: DecoderConfig,
    *,
    sharding: ShardingConfig | None = None,
    mesh: Mesh | None = None,
) -> Decoder:
    """The decoder with ShapeDtypeStruct parameters (no memory, no devices): `jax.eval_shape`."""
    return nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), sharding=sharding, mesh=mesh))


def parameter_shardings(model: Decoder, mesh: Mesh | None):
    """The sharding of every parameter of `model` (a State of shardings) on `mesh`."""
    state = nnx.state(model)
    return state_shardings(nnx.get_partition_spec(state), state, mesh)


def init_decoder(
    config: DecoderConfig,
    *,
    seed: int = 0,
    sharding: ShardingConfig | None = None,
    mesh: Mesh | None = None,
) -> Decoder:
    """A randomly initialised decoder whose parameters are created directly on their shards.

    Args:
      config: the architecture.
      seed: parameter initialisation seed.
      sharding: parameter/activation specs (default ShardingConfig()).
      mesh: a `data` x `fsdp` x `tensor` mesh (see make_mesh), or None for one device.

    Returns:
      The Decoder; each parameter's `.sharding` is its fitted NamedSharding on `mesh`.
    """
    abstract = abstract_decoder(config, sharding=sharding, mesh=mesh)
    graphdef, abstract_state = nnx.split(abstract)
    shardings = parameter_shardings(abstract, mesh)

    del abstract_state

    @jax.jit
    def create():
        state = nnx.state(Decoder(config, rngs=nnx.Rngs(seed), sharding=sharding, mesh=mesh))
        return state if mesh is None else jax.lax.with_sharding_constraint(state, shardings)

    return nnx.merge(graphdef, create())
