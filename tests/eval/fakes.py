"""A fake chain-task sampler whose verdicts the tests choose, per problem and sample."""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from gdro_jax import sampling, tasks


def chain_sampler(solved: Callable[[dict, int, float], bool]):
    """A sampler called like `sampling.generate` on chain-task prompts.

    Each slot writes its problem's gold solution when `solved(problem, sample, u)` (`sample`: the
    slot's index among its problem's slots; `u`: a uniform draw from the call's key), else the
    gold with a wrong first token (a solution never starts with an operation). It reads each
    chain back from the prompt tokens, so it checks that the harness hands every slot its own
    prompt.
    """

    def sample(model, prompt_tokens, *, prompt_lengths, prompt_of_slot, key, max_new_tokens, **kw):
        del model
        assert tuple(kw["eos_ids"]) == (tasks.EOS_ID,)
        problems = []
        for tokens, length in zip(
            np.asarray(prompt_tokens), np.asarray(prompt_lengths), strict=True
        ):
            chain = tasks.decode(tokens[:length])  # e.g. "3+4*7=" (<bos> dropped)
            pairs = chain[1:-1]
            problems.append(
                tasks.make_problem(int(chain[0]), list(pairs[::2]), [int(d) for d in pairs[1::2]])
            )
        slots = np.asarray(prompt_of_slot)
        gold_RM, lengths_R = tasks.encode_solutions(
            [problems[i]["solution"] for i in slots], max_new_tokens
        )
        u_R = np.asarray(jax.random.uniform(key, (len(slots),)))
        for r, i in enumerate(slots):
            if not solved(problems[i], int(np.sum(slots[:r] == i)), float(u_R[r])):
                gold_RM[r, 0] = tasks.VOCAB.index("*")
        return sampling.GenerationResult(
            tokens=jnp.asarray(gold_RM),
            logprobs=jnp.zeros(gold_RM.shape),
            lengths=jnp.asarray(lengths_R),
            finish_reasons=jnp.ones(len(slots), jnp.int32),
            prompt_tokens=jnp.asarray(prompt_tokens)[slots],
            prompt_lengths=jnp.asarray(prompt_lengths)[slots],
        )

    return sample
