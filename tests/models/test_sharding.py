"""The decoder on an 8-device fake CPU mesh (data 2, fsdp 2, tensor 2): parameters really sharded
as declared, and forward passes and gradients equal to one device's; spec fitting; remat; the
run-level mesh helpers (None for one device, batches on data x fsdp)."""

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from gdro_jax.models import (
    DecoderConfig,
    batch_sharding,
    constrain_batch,
    fit_spec,
    from_pretrained,
    init_decoder,
    make_mesh,
    mesh_shape,
    parameter_shardings,
    run_mesh,
)
from tests.models.hf_helpers import make_hf_model, padded_batch, random_prompts, save_hf_model

_forward = nnx.jit(lambda model, ids, positions, mask: model(ids, positions, mask))
# Batch 8 so that the batch dimension splits over data x fsdp = 4 devices.
BATCH = padded_batch(random_prompts((9, 4, 6, 1, 9, 2, 7, 5), seed=3), 9, left=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = save_hf_model(make_hf_model("qwen3_untied"), tmp_path_factory.mktemp("q3"))
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    return from_pretrained(folder), from_pretrained(folder, mesh=mesh), mesh


def test_parameters_are_sharded_as_declared(models):
    _, sharded, mesh = models
    state = nnx.state(sharded)
    specs = nnx.get_partition_spec(state)
    for (path, leaf), spec in zip(
        jax.tree.leaves_with_path(state),
        jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P)),
        strict=True,
    ):
        assert isinstance(leaf.sharding, NamedSharding), path
        assert leaf.sharding.mesh == mesh
        assert leaf.sharding.spec == fit_spec(spec, leaf.shape, dict(mesh.shape)), path
    q = sharded.layers.q[...]  # [L, D, N, H] on (-, fsdp, tensor, -)
    assert q.sharding.spec == P(None, "fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (2, 32, 2, 16)
    embed = sharded.embed[...]  # [V, D] on (tensor, fsdp)
    assert embed.addressable_shards[0].data.shape == (48, 32)
    assert len({s.device for s in q.addressable_shards}) == 8


def test_sharded_forward_equals_single_device(models):
    single, sharded, _ = models
    ids, mask, positions = BATCH
    expected = np.asarray(_forward(single, ids, positions, mask))
    out = _forward(sharded, ids, positions, mask)
    assert out.sharding.spec[0] in ("data", ("data", "fsdp"))  # the batch is split
    np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], atol=1e-5, rtol=0)


def _train_step(model, optimizer, ids, positions, mask):
    def loss_fn(model):
        logits = model(ids[:, :-1], positions[:, :-1], mask[:, :-1])
        logp = jax.nn.log_softmax(logits, axis=-1)
        token_logp = jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
        weight = mask[:, 1:] & mask[:, :-1]
        return -jnp.sum(token_logp * weight) / jnp.sum(weight)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


_train_step_jit = nnx.jit(_train_step)


@pytest.mark.slow
def test_sharded_rematerialised_unrolled_training_step_equals_single_device():
    """Two AdamW steps: one device (scanned blocks) vs the 8-device mesh with remat and
    unrolled blocks."""
    ids, mask, positions = (jnp.asarray(a) for a in BATCH)
    results = []
    for mesh, options in (
        (None, dict()),
        (make_mesh(data=2, fsdp=2, tensor=2), dict(remat=True, scan_layers=False)),
    ):
        model = init_decoder(DecoderConfig.tiny(**options), seed=1, mesh=mesh)
        # eps well above float32 noise: Adam divides by sqrt(v), which would blow up 1e-9
        # reduction-order differences in near-zero gradients into lr-sized update differences.
        optimizer = nnx.Optimizer(model, optax.adamw(1e-2, eps=1e-3), wrt=nnx.Param)
        losses = [float(_train_step_jit(model, optimizer, ids, positions, mask)) for _ in range(2)]
        results.append((losses, np.asarray(model.layers.up[...])))
        if mesh is not None:  # parameters keep their shardings through the update
            expected = parameter_shardings(model, mesh)["layers"]["up"].get_value()
            assert model.layers.up[...].sharding == expected
    (losses_single, up_single), (losses_sharded, up_sharded) = results
    np.testing.assert_allclose(losses_sharded, losses_single, rtol=1e-5)
    assert losses_single[1] < losses_single[0]
    np.testing.assert_allclose(up_sharded, up_single, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    sizes=st.tuples(st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2, 4]), st.integers(1, 3)),
    data=st.data(),
)
def test_fit_spec_keeps_only_dividing_axes(shape, sizes, data):
    axis_sizes = dict(zip(("data", "fsdp", "tensor"), sizes, strict=True))
    entries = [None, "data", "fsdp", "tensor", ("data", "fsdp"), ("fsdp", "tensor")]
    spec = P(*(data.draw(st.sampled_from(entries)) for _ in shape))
    fitted = fit_spec(spec, shape, axis_sizes)
    assert len(fitted) == len(shape)
    for dim, declared, entry in zip(shape, spec, fitted, strict=True):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
        declared = (
            () if declared is None else (declared,) if isinstance(declared, str) else declared
        )
        assert set(axes) <= set(declared)
        assert dim % int(np.prod([axis_sizes[a] for a in axes])) == 0
        if dim % int(np.prod([axis_sizes[a] for a in declared])) == 0:  # nothing to drop
            assert set(axes) == {a for a in declared if axis_sizes[a] > 1}


def test_model_rejects_a_mesh_with_other_axes_or_explicit_types():
    devices = np.asarray(jax.devices()[:8]).reshape(2, 2, 2)
    with pytest.raises(ValueError, match="axis names"):
        init_decoder(DecoderConfig.tiny(), mesh=Mesh(devices, ("a", "b", "c")))
    explicit = Mesh(devices, ("data", "fsdp", "tensor"), axis_types=(AxisType.Explicit,) * 3)
    with pytest.raises(ValueError, match="Auto"):
        init_decoder(DecoderConfig.tiny(), mesh=explicit)
    with pytest.raises(ValueError, match="tensor"):
        make_mesh(data=2, tensor=0)


def test_run_mesh_is_none_for_one_device_and_mesh_shape_reads_it_back():
    assert run_mesh() is None and mesh_shape(None) == (1, 1, 1)
    mesh = run_mesh(2, 2, 2)
    assert mesh.axis_names == ("data", "fsdp", "tensor") and mesh_shape(mesh) == (2, 2, 2)
    assert mesh_shape(run_mesh(1, 4, 1)) == (1, 4, 1)


def test_batches_go_on_data_by_fsdp_fitted_to_their_leading_axis():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    assert batch_sharding(None, (8,)) is None
    assert batch_sharding(mesh, (8, 3)).spec == P(("data", "fsdp"), None)
    assert batch_sharding(mesh, (6,)).spec == P("data")  # 4 does not divide 6; 2 does
    assert batch_sharding(mesh, (5,)).spec == P(None)
    tree = {"x": jnp.zeros((8, 3)), "y": jnp.zeros((4,))}
    assert constrain_batch(None, tree) is tree
    placed = jax.jit(lambda t: constrain_batch(mesh, t))(tree)
    for name, leaf in placed.items():
        assert leaf.sharding.is_equivalent_to(batch_sharding(mesh, leaf.shape), leaf.ndim), name
