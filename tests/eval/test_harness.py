"""The sampling settings both evaluations share: each task's defaults, and their checks."""

import pytest

from gdro_jax import eval as evaluation


def test_each_task_has_its_defaults():
    math, chain = evaluation.EvalSettings(), evaluation.EvalSettings.of("chain")
    # The paper's evaluation (Panaganti et al., 2026): 8 samples at T = 0.6, top-p 0.8, top-k 20.
    assert (math.num_samples, math.temperature, math.top_p, math.top_k) == (8, 0.6, 0.8, 20)
    assert evaluation.EvalSettings.of("math") == math and math.batch_size == 8
    # SPEC 11's frontier check: 8 samples at T = 1 without truncation.
    assert (chain.num_samples, chain.temperature, chain.top_p, chain.top_k) == (8, 1.0, 1.0, 0)
    assert chain.batch_size == 64 and evaluation.EvalSettings.of("chain", seed=3).seed == 3


@pytest.mark.parametrize("kind", ["math", "chain"])
@pytest.mark.parametrize(
    "field, value",
    [
        ("num_samples", 0),
        ("temperature", -0.1),
        ("top_p", 0.0),
        ("top_k", -1),
        ("max_new_tokens", 0),
        ("max_prompt_tokens", 2.5),
        ("batch_size", True),
        ("seed", -1),
    ],
)
def test_settings_validation_names_the_parameter(kind, field, value):
    with pytest.raises(ValueError, match=field):
        evaluation.EvalSettings.of(kind, **{field: value})
