"""The simulation loop: GRPO on the skill-chain learner with the GDRO controllers, in one jit.

One run is a `lax.scan` over steps of a pure step function; seeds are `vmap`-ed; the method is a
pair of traced booleans (`MethodFlags`), so one compilation serves every method of a config and
nothing recompiles when the controllers change their decisions (SPEC 6).

A step (SPEC 7): draw N prompts (epoch-shuffled, so every prompt is revisited); classify them
from history up to t-1; Rollout-GDRO allocates `n_i` with `sum n_i = R = N * n_mean`; Prompt-GDRO
gives advantage multipliers `w_i`; `R` Bernoulli rollouts; the exact GRPO gradient; an optimizer
step on the skill logits; then the classifier, Prompt-GDRO and Rollout-GDRO state transitions.

Every method runs all three controllers; a method only decides which decisions are *applied*.
Plain GRPO still logs the distribution `q` Prompt-GDRO would play and the shadow price `mu` of the
allocation Rollout-GDRO would make, observed on GRPO's own data. Seeds give common random numbers
across methods: the same pools, batches and uniforms, so method differences are paired.
"""

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from gdro_jax.controllers import (
    METHODS,
    PassKState,
    PromptGDROState,
    RolloutGDROState,
    get_method,
    passk_classifier,
    prompt_gdro,
    rollout_gdro,
    slots_from_counts,
)
from gdro_jax.sim._config import SimConfig
from gdro_jax.sim._grpo import grpo_policy_gradient
from gdro_jax.sim._learner import (
    PromptSet,
    exact_pass_at_k,
    initial_skill_logits,
    per_level_mean,
    sample_prompt_set,
    success_prob,
)


class MethodFlags(NamedTuple):
    """Which controller decisions a method applies (traced, so methods share one compilation)."""

    reweight: jax.Array  # [] bool apply Prompt-GDRO's advantage multipliers
    allocate: jax.Array  # [] bool apply Rollout-GDRO's rollout counts


# The parts of `controllers.METHODS` the simulator models, by decision.
SIMULATED_PARTS = {"prompt_adversary": ("prompt_gdro",), "rollout_allocation": ("rollout_gdro",)}


def _simulated(method) -> bool:
    return all(p in SIMULATED_PARTS.get(d, ()) for d, p in method.parts().items())


# The methods of `controllers.METHODS` whose every part the simulator models.
SIMULATED_METHODS = tuple(name for name, method in METHODS.items() if _simulated(method))


def method_flags(method: str) -> MethodFlags:
    """The `MethodFlags` of one of `controllers.METHODS` ("grpo", "prompt_gdro", ...), read off
    its record.

    Raises:
      ValueError: an unknown method, or one with a part the simulator does not model.
    """
    record = get_method(method)
    for decision, part in record.parts().items():
        if part not in SIMULATED_PARTS.get(decision, ()):
            raise ValueError(
                f"the simulator does not model {decision}={part!r} (method {method!r}); it "
                f"models {SIMULATED_PARTS}"
            )
    return MethodFlags(
        reweight=jnp.asarray(record.prompt_adversary is not None),
        allocate=jnp.asarray(record.rollout_allocation is not None),
    )


class SimState(NamedTuple):
    """The scan carry of one run."""

    theta: jax.Array  # [L] float32 skill logits
    opt_state: optax.OptState  # the optimizer's state for theta
    classifier: PassKState  # over the D training prompts
    prompt: PromptGDROState  # updated by every method, applied only when flags.reweight
    rollout: RolloutGDROState  # updated by every method, applied only when flags.allocate


class StepRecord(NamedTuple):
    """What one step logs (SPEC 10); stacked over steps (and seeds) by the scan (and vmap)."""

    q: jax.Array  # [B] float32 Prompt-GDRO's distribution over the batch's bins
    scores: jax.Array  # [B] float32 Prompt-GDRO's bin scores S(b) before the update
    variance: jax.Array  # [B] float32 Rollout-GDRO's per-bin variance proxy v(b) used
    bin_count: jax.Array  # [B] int32 the batch's prompts per bin
    rollouts_per_bin: jax.Array  # [B] int32 rollouts drawn per bin (as applied)
    rollouts_per_level: jax.Array  # [L] int32 rollouts drawn per true level (as applied)
    mu: jax.Array  # [] float32 Rollout-GDRO's shadow price
    lead_lag_gap: jax.Array  # [] float32 sum_b b q(b) - sum_b b share(b)
    mean_reward: jax.Array  # [] float32 mean reward of the step's R rollouts
    informative_fraction: jax.Array  # [] float32 fraction of groups with a non-zero advantage
    tokens: jax.Array  # [] int32 chain steps sampled (a level-l rollout has l), SPEC 11
    pass1: jax.Array  # [L] float32 exact held-out pass@1 per level before the step's update
    pass_k: jax.Array  # [L] float32 exact held-out pass@eval_k per level before the update


class SimOutput(NamedTuple):
    """One run (or a batch of seeds: every field gains a leading [S] axis)."""

    trace: StepRecord  # every field [T, ...]
    final_pass1: jax.Array  # [L] float32 exact held-out pass@1 per level after the last step
    final_pass_k: jax.Array  # [L] float32 exact held-out pass@eval_k per level after training
    final_theta: jax.Array  # [L] float32 skill logits after training


class Simulator(NamedTuple):
    """Pure functions of one `SimConfig` (see `make_simulator`)."""

    run_seed: Callable[[MethodFlags, jax.Array], SimOutput]
    run: Callable[[MethodFlags, jax.Array], SimOutput]
    config: SimConfig
    num_bins: int


def _optimizer(config: SimConfig) -> optax.GradientTransformation:
    if config.optimizer == "adam":
        return optax.adam(config.learning_rate)
    return optax.sgd(config.learning_rate)


# XLA options for short runs (tests, notebook sweeps): about 3x faster compilation of the scan for
# about 3x slower steps, measured on a 2-core CPU.
FAST_COMPILE_OPTIONS = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
}


def make_simulator(config: SimConfig, *, fast_compile: bool = False) -> Simulator:
    """Builds the simulation of `config` for every method.

    Args:
      config: the simulation's knobs.
      fast_compile: compile with `FAST_COMPILE_OPTIONS` (worth it when compilation dominates).

    Returns:
      A `Simulator` with
        `run_seed(flags, key) -> SimOutput`: one run, pure and unjitted;
        `run(flags, keys_S) -> SimOutput`: `jax.jit(jax.vmap(run_seed))` over a batch of seed
        keys, compiled once for all methods (flags are traced).
    """
    classifier = passk_classifier(config.pool_size, **config.classifier)
    num_bins = classifier.num_bins
    prompt_adversary = prompt_gdro(num_bins=num_bins, **config.prompt_gdro)
    rollout_adversary = rollout_gdro(
        num_bins=num_bins,
        **{
            "n_mean": config.n_mean,
            # The Bernoulli proxies scale with the reward's range, as in the trainer.
            "reward_values": (config.reward_wrong, config.reward_correct),
            **config.rollout_gdro,
        },
    )
    optimizer = _optimizer(config)
    num_prompts, num_slots, num_levels = config.num_prompts, config.num_slots, config.num_levels
    pool_counts_L = config.pool_counts
    heldout_counts_L = np.full(num_levels, config.heldout_per_level)
    steps_per_epoch = config.pool_size // num_prompts
    bin_index_B = jnp.arange(num_bins, dtype=jnp.float32)

    def evaluate(theta_L: jax.Array, heldout: PromptSet) -> tuple[jax.Array, jax.Array]:
        p_H = success_prob(theta_L, heldout.level_P, heldout.offset_P)
        pass1_L = per_level_mean(p_H, heldout.level_P, num_levels)
        pass_k_L = per_level_mean(exact_pass_at_k(p_H, config.eval_k), heldout.level_P, num_levels)
        return pass1_L, pass_k_L

    num_epochs = -(-config.steps // steps_per_epoch)

    def epoch_orders(shuffle_key: jax.Array) -> jax.Array:
        # Epoch shuffling as a data loader does: each epoch is one permutation of the pool cut
        # into steps_per_epoch batches (the remainder D mod N is left out of that epoch). Drawn
        # once before the scan: a sort of D per epoch, not per step.
        epoch_keys = jax.random.split(shuffle_key, num_epochs)
        return jax.vmap(lambda k: jax.random.permutation(k, config.pool_size))(epoch_keys)

    def batch_ids(order_ED: jax.Array, step: jax.Array) -> jax.Array:
        epoch, position = step // steps_per_epoch, step % steps_per_epoch
        return jax.lax.dynamic_slice(order_ED[epoch], (position * num_prompts,), (num_prompts,))

    def per_group(values_N: jax.Array, group_N: jax.Array, num_groups: int) -> jax.Array:
        # One-hot contraction: B and L are small, and a dot compiles faster than a scatter.
        onehot_NG = jax.nn.one_hot(group_N, num_groups, dtype=jnp.int32)
        return values_N.astype(jnp.int32) @ onehot_NG

    def run_seed(flags: MethodFlags, key: jax.Array) -> SimOutput:
        pool_key, heldout_key, shuffle_key, run_key = jax.random.split(key, 4)
        pool = sample_prompt_set(pool_key, pool_counts_L, config.offset_std)
        heldout = sample_prompt_set(heldout_key, heldout_counts_L, config.offset_std)
        order_ED = epoch_orders(shuffle_key)
        if config.init_logits:
            theta_L = jnp.asarray(config.init_logits, jnp.float32)
        else:
            theta_L = initial_skill_logits(
                num_levels, config.init_logit_first, config.init_logit_slope
            )
        state = SimState(
            theta=theta_L,
            opt_state=optimizer.init(theta_L),
            classifier=classifier.init(),
            prompt=prompt_adversary.init(),
            rollout=rollout_adversary.init(),
        )

        def step(state: SimState, inputs: tuple[jax.Array, jax.Array]):
            step_index, step_key = inputs
            allocate_key, rollout_key = jax.random.split(step_key)
            ids_N = batch_ids(order_ED, step_index)
            level_N, offset_N = pool.level_P[ids_N], pool.offset_P[ids_N]

            # Plan from history up to t-1 (SPEC 3, timing).
            bins_N = classifier.bins(state.classifier, ids_N)
            p_hat_N = classifier.p_hat(state.classifier, ids_N)
            allocated_N, info = rollout_adversary.allocate(
                state.rollout, bins_N, p_hat_N, allocate_key
            )
            n_N = jnp.where(flags.allocate, allocated_N, config.n_mean).astype(jnp.int32)
            count_B = per_group(jnp.ones_like(bins_N), bins_N, num_bins)
            q_B = prompt_adversary.distribution(state.prompt, count_B > 0)
            weight_N = jnp.where(
                flags.reweight,
                prompt_adversary.weights(state.prompt, bins_N, num_rollouts=n_N),
                1.0,
            )

            # Roll out R Bernoulli samples and take the exact GRPO step.
            slot_R = slots_from_counts(n_N, num_slots)
            p_N = success_prob(state.theta, level_N, offset_N)
            success_R = jax.random.uniform(rollout_key, (num_slots,)) < p_N[slot_R]
            grad_L, stats = grpo_policy_gradient(
                state.theta,
                level_N,
                offset_N,
                slot_R,
                success_R,
                weight_N,
                reward_correct=config.reward_correct,
                reward_wrong=config.reward_wrong,
                scale_by_std=config.scale_by_std,
                estimator=config.advantage_estimator,
            )
            updates_L, opt_state = optimizer.update(-grad_L, state.opt_state, state.theta)
            theta_L = optax.apply_updates(state.theta, updates_L)

            # Observe: the adversaries' loss signal and the three state transitions.
            if config.loss_signal == "failure_rate":
                losses_N = 1.0 - stats.num_correct_N / stats.num_rollouts_N
            else:
                advantage_sum_N = jax.ops.segment_sum(stats.advantage_R, slot_R, num_prompts)
                losses_N = -advantage_sum_N / stats.num_rollouts_N
            classifier_state = classifier.update(
                state.classifier, ids_N, num_correct=stats.num_correct_N, num_rollouts=n_N
            )
            prompt_state = prompt_adversary.update(state.prompt, bins_N, losses=losses_N)
            rollout_state = rollout_adversary.update(
                state.rollout,
                bins_N,
                p_hat=classifier.p_hat(classifier_state, ids_N),
                losses=losses_N,
                num_correct=stats.num_correct_N,
                num_rollouts=n_N,
            )

            pass1_L, pass_k_L = evaluate(state.theta, heldout)
            share_B = count_B / num_prompts
            record = StepRecord(
                q=q_B,
                scores=state.prompt.scores,
                variance=info.variance_per_bin,
                bin_count=count_B,
                rollouts_per_bin=per_group(n_N, bins_N, num_bins),
                rollouts_per_level=per_group(n_N, level_N - 1, num_levels),
                mu=info.mu,
                lead_lag_gap=jnp.sum(bin_index_B * (q_B - share_B)),
                mean_reward=jnp.mean(
                    jnp.where(success_R, config.reward_correct, config.reward_wrong)
                ),
                informative_fraction=jnp.mean(stats.informative_N),
                tokens=jnp.sum(n_N * level_N),
                pass1=pass1_L,
                pass_k=pass_k_L,
            )
            new_state = SimState(theta_L, opt_state, classifier_state, prompt_state, rollout_state)
            return new_state, record

        inputs = (
            jnp.arange(config.steps, dtype=jnp.int32),
            jax.random.split(run_key, config.steps),
        )
        state, trace = jax.lax.scan(step, state, inputs)
        final_pass1_L, final_pass_k_L = evaluate(state.theta, heldout)
        return SimOutput(
            trace=trace,
            final_pass1=final_pass1_L,
            final_pass_k=final_pass_k_L,
            final_theta=state.theta,
        )

    return Simulator(
        run_seed=run_seed,
        run=jax.jit(
            jax.vmap(run_seed, in_axes=(None, 0)),
            compiler_options=FAST_COMPILE_OPTIONS if fast_compile else None,
        ),
        config=config,
        num_bins=num_bins,
    )


def seed_keys(num_seeds: int, seed: int = 0) -> jax.Array:
    """Returns `num_seeds` independent PRNG keys derived from `seed`."""
    return jax.random.split(jax.random.key(seed), num_seeds)


def simulate(
    config: SimConfig,
    methods: Sequence[str] = SIMULATED_METHODS,
    *,
    num_seeds: int = 8,
    seed: int = 0,
    progress: bool = False,
    fast_compile: bool = False,
    simulator: Simulator | None = None,
) -> dict[str, SimOutput]:
    """Runs each method over `num_seeds` seeds (the same seeds for every method).

    Args:
      config: the simulation.
      methods: names from `SIMULATED_METHODS` (the records of `controllers.METHODS` whose
        parts the simulator models).
      num_seeds: seeds S, run in one vmapped call per method.
      seed: root seed of the S seed keys.
      progress: show a tqdm bar over methods.
      fast_compile: see `make_simulator`.
      simulator: a prebuilt `make_simulator(config)` to reuse its compilation.

    Returns:
      `{method: SimOutput}` of numpy arrays, each with a leading [S] axis.
    """
    for method in methods:
        method_flags(method)
    if simulator is None:
        simulator = make_simulator(config, fast_compile=fast_compile)
    keys_S = seed_keys(num_seeds, seed)
    outputs = {}
    for method in tqdm(methods, desc="methods", disable=not progress):
        result = simulator.run(method_flags(method), keys_S)
        outputs[method] = jax.tree.map(np.asarray, result)
    return outputs
