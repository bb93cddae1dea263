"""What a rematerialised block keeps (`DecoderConfig.remat_policy`), and that keeping it changes
no gradient."""

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals

from gdro_jax import configs, models
from gdro_jax.models import DecoderConfig
from gdro_jax.sampling import sequence_logprobs

# D=16, N*H=32, K*H=16, F=24, V=40: the matmuls' outputs have distinct widths where it matters.
TINY = dict(
    vocab_size=40, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=24
)
B, T = 2, 5


def _inputs():
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(1, TINY["vocab_size"], (B, T)), jnp.int32)
    mask = jnp.asarray(np.arange(T)[None] >= np.array([[0], [2]]))  # row 1 left-padded by 2
    return tokens, mask


def _loss(graphdef, tokens, mask):
    def loss(state):
        return -jnp.sum(
            sequence_logprobs(nnx.merge(graphdef, state), tokens, attention_mask_BT=mask)
        )

    return loss


def _saved_rows(config: DecoderConfig) -> list[str]:
    """The residuals the backward pass keeps with a row per token ([B*T, width], or [L, B*T,
    width] stacked by the layers' scan), as jax's own `print_saved_residuals` lists them (one
    line each: type and shape, then where it comes from): the matmuls' outputs, which `_dense`
    takes on its rows flattened."""
    graphdef, state = nnx.split(models.init_decoder(config, seed=0))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(_loss(graphdef, *_inputs()), state)
    L = config.num_layers
    shapes = [line.split()[0] for line in out.getvalue().splitlines()]
    return sorted(s for s in shapes if s.startswith((f"f32[{B * T},", f"f32[{L},{B * T},")))


@pytest.mark.parametrize("scan_layers", [True, False])
def test_dots_keeps_the_projections_outputs_and_nothing_keeps_none(scan_layers):
    """'nothing' keeps no matmul output of a block (its forward pass runs again): of the rows,
    only the output projection's input outside the blocks; 'dots' keeps the query, key, value,
    gate and up projections of every layer too, so the backward pass does not redo them."""
    base = DecoderConfig.tiny(**TINY, remat=True, scan_layers=scan_layers)
    head_input = f"f32[{B * T},{TINY['d_model']}]"
    assert _saved_rows(base) == [head_input]
    kept = _saved_rows(base.replace(remat_policy="dots"))
    L = TINY["num_layers"]
    prefix = f"f32[{L},{B * T}," if scan_layers else f"f32[{B * T},"
    per_layer = 1 if scan_layers else L
    assert kept.count(f"{prefix}32]") == per_layer  # queries, N*H
    assert kept.count(f"{prefix}24]") == 2 * per_layer  # gate and up, F
    keys_and_values = kept.count(f"{prefix}16]") - (0 if scan_layers else 1)  # K*H
    assert keys_and_values >= 2 * per_layer


def test_the_policy_changes_no_gradient():
    """The gradient of a sequence's log-probs with remat off, 'nothing' and 'dots': the same
    arithmetic, so equal up to the rounding of another fusion (float32, 1e-6 of the largest
    entry)."""
    tokens, mask = _inputs()
    grads = {}
    for name, overrides in {
        "off": dict(remat=False),
        "nothing": dict(remat=True),
        "dots": dict(remat=True, remat_policy="dots"),
    }.items():
        graphdef, state = nnx.split(
            models.init_decoder(DecoderConfig.tiny(**TINY, **overrides), seed=0)
        )
        grads[name] = jax.tree.leaves(jax.jit(jax.grad(_loss(graphdef, tokens, mask)))(state))
    for name in ("nothing", "dots"):
        for want, got in zip(grads["off"], grads[name], strict=True):
            scale = float(jnp.max(jnp.abs(want)))
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * max(scale, 1.0))


def test_an_unknown_policy_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"DecoderConfig\.remat_policy must be one of .*'all'"):
        DecoderConfig.tiny(**TINY, remat_policy="all")


def test_a_runs_policy_reaches_the_policy_it_builds(tmp_path):
    """`config.model.remat_policy` travels with the run's other policy overrides, into a policy
    loaded from a folder (`init_from`) as into one built from the `model` block."""
    models.save_pretrained(models.init_decoder(DecoderConfig.tiny(**TINY), seed=0), tmp_path)
    config = configs.run_config()
    config.model.update(remat=True, remat_policy="dots")
    assert configs.policy_config(config).remat_policy == "dots"
    overrides = configs.policy_overrides(config)
    dtype = overrides.pop("param_dtype")  # as train.load_policy does
    assert models.from_pretrained(tmp_path, dtype=dtype, **overrides).config.remat_policy == "dots"
    config.init_from = str(tmp_path)
    assert configs.policy_config(config).remat_policy == "dots"
