"""HF folders in and out: round trips through our loader and transformers', both config styles,
bf16 checkpoints, sharded files, tokenizers, and the errors of malformed folders."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file

from gdro_jax.models import ModelFolderError, from_pretrained, load_tokenizer, save_pretrained
from tests.models.hf_helpers import (
    hf_logits,
    make_hf_model,
    padded_batch,
    random_prompts,
    save_hf_model,
)

_forward = nnx.jit(lambda model, ids, positions, mask: model(ids, positions, mask))
BATCH = padded_batch(random_prompts((7, 3, 5)), 7, left=True)


def _logits(model) -> np.ndarray:
    ids, mask, positions = BATCH
    return np.asarray(_forward(model, ids, positions, mask))


@pytest.fixture(scope="module", params=["qwen3_tied", "qwen3_untied"])
def source(request, tmp_path_factory):
    """(transformers model, its folder, our model loaded from it)."""
    hf_model = make_hf_model(request.param)
    folder = save_hf_model(hf_model, tmp_path_factory.mktemp(request.param))
    return hf_model, folder, from_pretrained(folder)


def test_export_then_reload_gives_identical_logits(source, tmp_path):
    _, _, model = source
    save_pretrained(model, tmp_path)
    np.testing.assert_array_equal(_logits(from_pretrained(tmp_path)), _logits(model))


def test_transformers_loads_our_sharded_export_with_the_same_logits(source, tmp_path):
    _, _, model = source
    save_pretrained(model, tmp_path, max_shard_bytes=40_000)
    assert os.path.isfile(tmp_path / "model.safetensors.index.json")
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 1
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids, mask, positions = BATCH
    np.testing.assert_allclose(
        hf_logits(reloaded, ids, mask, positions)[mask], _logits(model)[mask], atol=1e-4, rtol=0
    )
    # And our loader reads the sharded folder back exactly.
    np.testing.assert_array_equal(_logits(from_pretrained(tmp_path)), _logits(model))


def test_legacy_rope_theta_and_torch_dtype_config_style_loads_the_same(source, tmp_path):
    _, _, model = source
    save_pretrained(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_theta"] = config.pop("rope_parameters")["rope_theta"]
    config["torch_dtype"] = config.pop("dtype")
    config["rope_scaling"] = None
    (tmp_path / "config.json").write_text(json.dumps(config))
    np.testing.assert_array_equal(_logits(from_pretrained(tmp_path)), _logits(model))


def test_bfloat16_checkpoint_and_bfloat16_parameters(source, tmp_path):
    _, _, model = source
    hf_bf16 = make_hf_model("qwen3_tied" if model.config.tie_embeddings else "qwen3_untied")
    hf_bf16.to(dtype=torch.bfloat16).save_pretrained(tmp_path)
    as_float32 = from_pretrained(tmp_path, dtype=jnp.float32)
    stored = load_file(str(tmp_path / "model.safetensors"))["model.embed_tokens.weight"]
    np.testing.assert_array_equal(np.asarray(as_float32.embed[...]), stored.astype(np.float32))
    as_bf16 = from_pretrained(tmp_path, dtype=jnp.bfloat16)
    assert as_bf16.layers.q[...].dtype == jnp.bfloat16
    reference, ours = _logits(as_float32), _logits(as_bf16)
    _, mask, _ = BATCH
    assert np.abs(ours - reference)[mask].max() < 0.05 * np.abs(reference).max()


def test_tokenizer_round_trip(source, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    _, _, model = source
    vocab = {f"w{i}": i for i in range(model.config.vocab_size - 1)} | {"<unk>": 95}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")
    save_pretrained(model, tmp_path, tokenizer=tokenizer)
    loaded = load_tokenizer(tmp_path)
    assert loaded("w3 w17 w5 zz")["input_ids"] == [3, 17, 5, 95]


# ----------------------------------------------------------------------------------------------
# Malformed folders.


@pytest.fixture(scope="module")
def clean_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clean")
    save_hf_model(make_hf_model("qwen3_untied"), folder)
    return folder


def _copy_with(clean_folder, tmp_path, edit_tensors=None, edit_config=None):
    tensors = load_file(str(clean_folder / "model.safetensors"))
    config = json.loads((clean_folder / "config.json").read_text())
    if edit_tensors:
        edit_tensors(tensors)
    if edit_config:
        edit_config(config)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_missing_tensor_error_names_it(clean_folder, tmp_path):
    name = "model.layers.1.self_attn.k_norm.weight"
    folder = _copy_with(clean_folder, tmp_path, edit_tensors=lambda t: t.pop(name))
    with pytest.raises(ModelFolderError) as error:
        from_pretrained(folder)
    message = str(error.value)
    assert name in message and "expected shape (16,)" in message and "found no such" in message


def test_extra_tensor_error_names_it(clean_folder, tmp_path):
    name = "model.layers.0.self_attn.rogue.weight"
    folder = _copy_with(
        clean_folder, tmp_path, edit_tensors=lambda t: t.update({name: np.zeros((3, 2), "f4")})
    )
    with pytest.raises(ModelFolderError) as error:
        from_pretrained(folder)
    message = str(error.value)
    assert name in message and "expected no such tensor" in message and "(3, 2)" in message


def test_wrong_shape_error_names_tensor_expected_and_found(clean_folder, tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    folder = _copy_with(
        clean_folder, tmp_path, edit_tensors=lambda t: t.update({name: np.zeros((95, 64), "f4")})
    )
    with pytest.raises(ModelFolderError) as error:
        from_pretrained(folder)
    message = str(error.value)
    assert name in message and "expected (96, 64)" in message and "found (95, 64)" in message


def test_unsupported_architecture_error_names_the_field(clean_folder, tmp_path):
    folder = _copy_with(
        clean_folder,
        tmp_path,
        edit_config=lambda c: c.update(architectures=["MistralForCausalLM"], model_type="mistral"),
    )
    with pytest.raises(ValueError) as error:
        from_pretrained(folder)
    message = str(error.value)
    assert "'architectures'" in message and "Qwen3ForCausalLM" in message
    assert "MistralForCausalLM" in message


@pytest.mark.parametrize(
    "field, value, expected, found",
    [
        ("use_sliding_window", True, "false", "True"),
        ("hidden_act", "gelu", "'silu'", "'gelu'"),
        ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4}, "'llama3'", "'yarn'"),
    ],
)
def test_unsupported_config_field_error_names_it(
    clean_folder, tmp_path, field, value, expected, found
):
    folder = _copy_with(clean_folder, tmp_path, edit_config=lambda c: c.update({field: value}))
    with pytest.raises(ValueError) as error:
        from_pretrained(folder)
    message = str(error.value)
    assert (
        field in message
        and expected in message
        and str(value.get("rope_type") if isinstance(value, dict) else value) in message
    )


def test_missing_files_raise_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(tmp_path)
