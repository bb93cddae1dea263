"""Stop checks once per k decode steps (`generate(..., stop_check_every=k)`): the decode loops run
k steps per iteration, so their stop condition (on a GPU a copy to the host and a wait) is
checked once per k steps. The completions are those of a check every step, for both loops, with
windows whose sizes k does not divide (the steps that end a window one at a time), micro-batches,
a queue and the lanes' halvings. Planted, each seen failing: a chunk allowed to run past its
window's end, in the static loop and in the continuous loop with a lane per request."""

import jax
import numpy as np
import pytest

from gdro_jax import models
from gdro_jax.sampling import generate
from tests.sampling._reference import CONFIG, PROMPTS, SLOTS, M, sample, sub_jaxprs

# (batching, micro_batch_slots): static chunks of 8; continuous with a queue (5 lanes for 24
# requests); continuous with a lane per request (24 lanes, halving to 12, 6, 3).
FORMS = [("static", 8), ("continuous", 5), ("continuous", None)]


@pytest.fixture(scope="module")
def model():
    return models.init_decoder(CONFIG, seed=0)


@pytest.fixture(scope="module")
def every_step(model):
    """The completions with a check every step, windows of 4 tokens (blocks of 4, 4 and 2)."""
    return {form: sample(model, form[1], batching=form[0], decode_window=4) for form in FORMS}


@pytest.mark.parametrize("form", FORMS, ids=lambda form: f"{form[0]}-{form[1]}")
def test_checks_every_3_steps_give_the_same_completions(model, every_step, form):
    """Tokens, lengths and finish reasons exact, log-probs within 1e-6 (the same step, in
    another loop). Windows of 4 in chunks of 3: a chunk, then the window's last step alone;
    slots stop inside chunks, and the last window (steps 9 and 10) has no room for one."""
    want = every_step[form]
    got = sample(model, form[1], batching=form[0], decode_window=4, stop_check_every=3)
    for name in ("tokens", "lengths", "finish_reasons"):
        np.testing.assert_array_equal(
            np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), err_msg=name
        )
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), atol=1e-6)
    lengths = np.asarray(got.lengths)
    assert lengths.min() < 3 and lengths.max() == M, lengths  # stops early, and at the cap


def _loops(jaxpr, found):
    """(`while` count, the lengths of `scan`s found inside a while's body) of a jaxpr, nested."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            found["while"] += 1
            body = eqn.params["body_jaxpr"].jaxpr
            found["scans_in_while"] += [
                e.params["length"] for e in body.eqns if e.primitive.name == "scan"
            ]
        for inner in sub_jaxprs(eqn):
            _loops(inner, found)
    return found


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_a_chunk_is_one_fixed_trip_loop_inside_the_checked_loop(model, batching):
    """The program holds, inside a while loop, a scan of k steps (XLA's loop of a static trip
    count) only when asked: one window, so one chunked loop and its one-step loop."""

    def loops(k):
        fn = lambda: generate(  # noqa: E731
            model, PROMPTS, key=jax.random.key(0), max_new_tokens=M, prompt_of_slot=SLOTS,
            batching=batching, decode_window=M, lane_halvings=0, stop_check_every=k,
        )  # fmt: skip
        return _loops(jax.make_jaxpr(fn)().jaxpr, {"while": 0, "scans_in_while": []})

    assert loops(1)["scans_in_while"] == []
    chunked, plain = loops(5), loops(1)
    assert chunked["scans_in_while"] == [5]
    assert chunked["while"] == plain["while"] + 1  # the chunks' loop, before the one-step loop


def test_a_check_count_below_one_is_refused_naming_it(model):
    refused = r"stop_check_every must be an int >= 1, got stop_check_every=0"
    with pytest.raises(ValueError, match=refused):
        generate(model, PROMPTS, key=jax.random.key(0), max_new_tokens=M, stop_check_every=0)
