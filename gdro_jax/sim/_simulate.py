"""The simulation loop: GRPO on the skill-chain learner with the controllers, in one jit.

One run is a `lax.scan` over steps of a pure step function; seeds are `vmap`-ed; the method is
traced (`MethodFlags`: per decision, the part of `controllers.PARTS` that fills it), so one
compilation serves every method of a config and nothing recompiles when the controllers change
their decisions (SPEC 6). Which parts are compiled in is static (`make_simulator(config,
parts=...)`, see `_parts`): the GDRO parts always, the rivals (Knapsack-RL, VIP, MoPPS,
dynamic sampling) only when asked for, so the GDRO methods' program carries none of them, and their
numbers do not depend on which rivals are compiled beside them.

A step (SPEC 7) makes the four decisions of `controllers.DECISIONS` through the trainer's own
composition (`controllers.multi_adversary`), given every compiled part as an alternative of its
decision and the flags' choice of the applied one: draw N prompts (epoch-shuffled, so every
prompt is revisited; or a prompt sampler's draw, MoPPS's Thompson draw over the pool; or
Prompt-GDRO's `resample` draw); classify them from history up to t-1; a rollout allocation
(Rollout-GDRO by bin, Knapsack-RL from each prompt's own history, VIP from a Gaussian process's
predictions) gives `n_i` with
`sum n_i = R = N * n_mean`; a prompt adversary (Prompt-GDRO) gives advantage multipliers `w_i`;
`R` Bernoulli rollouts; the exact GRPO gradient; an optimizer step on the skill logits; then the
adversaries' per-prompt loss signal, the trainer's `losses.prompt_loss_signal`, and the state
transitions of every compiled part.

Under a group filter (dynamic sampling) a step is a round of the same R rollouts (equal
compute): its groups whose rewards are not all equal join the filter's buffer, and the optimizer
step is taken only on a round where the buffer is ready (full, or `max_rounds` reached), along
the exact GRPO gradient of the buffered groups; other rounds leave theta and the optimizer state
unchanged (`StepRecord.updated`).

Every method runs all compiled controllers; a method only decides which decisions are *applied*.
Plain GRPO still logs the distribution `q` Prompt-GDRO would play and the shadow price `mu` of the
allocation Rollout-GDRO would make, observed on GRPO's own data. Seeds give common random numbers
across methods: the same pools, batches and uniforms, so method differences are paired.

One module over 400 lines, on purpose: the step is one traced function, read top to bottom as
SPEC 7 is, and its pieces close over the compiled parts.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from gdro_jax import losses
from gdro_jax.controllers import (
    Filtered,
    GDROState,
    MultiAdversary,
    PlanKeys,
    multi_adversary,
    passk_classifier,
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
from gdro_jax.sim._parts import (
    DECISION_OF_PART,
    GDRO_METHODS,
    GDRO_PARTS,
    MethodFlags,
    build_part,
    call_named,
    check_flags,
    compiled_parts,
    method_flags,
    method_parts,
    part_index,
)


class BufferedGroups(NamedTuple):
    """The groups dynamic sampling buffers: each holds `n_mean` rollouts of one prompt."""

    success: jax.Array  # [N, n_mean] bool the group's rollouts
    level: jax.Array  # [N] int32 its prompt's level (0 in an empty slot of the buffer)
    offset: jax.Array  # [N] float32 its prompt's offset


class SimState(NamedTuple):
    """The scan carry of one run."""

    theta: jax.Array  # [L] float32 skill logits
    opt_state: optax.OptState  # the optimizer's state for theta
    # The composition's state: the classifier over the D training prompts and each compiled
    # part's state by its name in `controllers.PARTS` (the GDRO parts' always): every part
    # observes every method's steps; a method's flags say which parts are applied.
    controllers: GDROState


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
    prompt_ids: jax.Array  # [N] int32 the batch's pool prompts (as drawn)
    num_rollouts: jax.Array  # [N] int32 rollouts of each prompt (as applied; sum R)
    num_correct: jax.Array  # [N] int32 correct rollouts of each prompt
    success_prob: jax.Array  # [N] float32 each prompt's true success probability p (pre-update)
    theta: jax.Array  # [L] float32 the skill logits the step's rollouts were drawn with
    updated: jax.Array  # [] bool an optimizer step was taken (False: a waiting round)


class SimOutput(NamedTuple):
    """One run (or a batch of seeds: every field gains a leading [S] axis)."""

    trace: StepRecord  # every field [T, ...]
    final_pass1: jax.Array  # [L] float32 exact held-out pass@1 per level after the last step
    final_pass_k: jax.Array  # [L] float32 exact held-out pass@eval_k per level after training
    final_theta: jax.Array  # [L] float32 skill logits after training
    pool: PromptSet | None = None  # [D] the training prompts, which `trace.prompt_ids` index


class Simulator(NamedTuple):
    """Pure functions of one `SimConfig` and one set of compiled parts (see `make_simulator`)."""

    run_seed: Callable[[MethodFlags, jax.Array], SimOutput]
    run: Callable[[MethodFlags, jax.Array], SimOutput]
    batched: Callable[[MethodFlags, jax.Array], SimOutput]
    config: SimConfig
    num_bins: int
    parts: tuple[str, ...]
    # The trainer's composition (`controllers.multi_adversary`) over every compiled part, each an
    # alternative of its decision, and the map `applied(flags) -> {part: [] bool}` that chooses
    # the applied ones: what a step plans, filters and updates with.
    decisions: MultiAdversary
    applied: Callable[[MethodFlags], dict[str, jax.Array]]


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


def make_simulator(
    config: SimConfig,
    *,
    parts: Sequence[str] = GDRO_PARTS,
    fast_compile: bool = False,
    compiler_options: Mapping[str, Any] | None = None,
) -> Simulator:
    """Builds the simulation of `config` for every method whose parts are compiled in.

    Args:
      config: the simulation's knobs.
      parts: names from `ALL_PARTS` to compile in (static); the GDRO parts always are. A method
        needing a part left out is refused by name (`method_flags`, `Simulator.run`), so the
        default program holds the GDRO methods only, at their old size; `method_parts(methods)`
        gives what a list of methods needs.
      fast_compile: compile with `FAST_COMPILE_OPTIONS` (worth it when compilation dominates).
      compiler_options: XLA options for the compiled program (`jax.jit`'s), over
        `FAST_COMPILE_OPTIONS` where `fast_compile` is set.

    Returns:
      A `Simulator` with
        `run_seed(flags, key) -> SimOutput`: one run, pure and unjitted (flags unchecked);
        `run(flags, keys_S) -> SimOutput`: checks concrete flags against the compiled parts, then
        calls `batched`;
        `batched`: `jax.jit(jax.vmap(run_seed))` over a batch of seed keys, compiled once for all
        methods (flags are traced);
        `parts`: the compiled parts, in `ALL_PARTS` order.

    Raises:
      ValueError: an unknown part, or a bad value in the block of a compiled part (named as
        `knapsack.n_max`, ...), or compiled parts that no method could combine (a prompt
        sampler beside Prompt-GDRO's `realisation="resample"`, as the trainer refuses).
    """
    parts = compiled_parts(parts)
    classifier_block = dict(config.classifier)
    bins_from = classifier_block.pop("bins_from", "prompt")  # the composition's, as the trainer's
    classifier = call_named("classifier", passk_classifier, config.pool_size, **classifier_block)
    num_bins = classifier.num_bins
    # Every compiled part from its factory in `controllers.PARTS` and its block (the rivals only
    # when compiled in, as the trainer builds its method's parts only), by the decision it fills.
    built = {part: build_part(config, part, num_bins) for part in parts}

    def of_decision(decision: str) -> dict[str, Any]:
        return {part: built[part] for part in parts if DECISION_OF_PART[part] == decision}

    group_filters = of_decision("group_filter")
    # The trainer's composition, given every compiled part as an alternative of its decision:
    # the flags choose the applied one (traced), and every part observes every step.
    try:
        decisions = multi_adversary(
            classifier,
            of_decision("prompt_adversary"),
            of_decision("rollout_allocation"),
            sampler=of_decision("prompt_sampler"),
            group_filter=group_filters,
            n_mean=config.n_mean,
            bins_from=bins_from,
            num_prompts=config.num_prompts,
        )
    except ValueError as error:
        if str(error).startswith("bins_from"):  # the one field it reads from the classifier block
            raise ValueError(f"classifier.{error}") from None
        raise

    def applied(flags: MethodFlags) -> dict[str, jax.Array]:
        """`{part: [] bool}`: whether `flags` hand the decision `part` fills to `part`."""
        return {
            part: getattr(flags, DECISION_OF_PART[part]) == part_index(DECISION_OF_PART[part], part)
            for part in parts
        }

    optimizer = _optimizer(config)
    num_prompts, num_slots, num_levels = config.num_prompts, config.num_slots, config.num_levels
    pool_counts_L = config.pool_counts
    heldout_counts_L = np.full(num_levels, config.heldout_per_level)
    steps_per_epoch = config.pool_size // num_prompts
    bin_index_B = jnp.arange(num_bins, dtype=jnp.float32)
    gradient_options = dict(
        reward_correct=config.reward_correct,
        reward_wrong=config.reward_wrong,
        scale_by_std=config.scale_by_std,
        estimator=config.advantage_estimator,
    )
    # A rollout of the learner is one "token", scored by the policy that sampled it: the loss
    # signal's ratio is 1 (logp = old_logp), as at the trainer's first mini-batch of a step.
    logp_R1 = jnp.zeros((num_slots, 1), jnp.float32)
    mask_R1 = jnp.ones((num_slots, 1), bool)

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

    # A group filter's groups are N x n_mean slots (it allocates nothing): their prompt of slot.
    uniform_slot_R = slots_from_counts(np.full(num_prompts, config.n_mean), num_slots)

    def buffered_gradient(theta_L: jax.Array, filtered: Filtered) -> jax.Array:
        """The exact GRPO gradient of the group filter's buffered groups (`filtered.groups`),
        whose rows make the GRPO groups `filtered.group_of_row` says (a row each, or
        Pilot-Commit's pairs of a pilot and a commit row of one prompt)."""
        held = filtered.groups
        group_of_row = filtered.group_of_row
        # The rows of a group share their prompt: its level and offset, by group.
        level_G = jnp.zeros_like(held.level).at[group_of_row].set(held.level)
        offset_G = jnp.zeros_like(held.offset).at[group_of_row].set(held.offset)
        # Dynamic sampling's groups were all sampled under theta (nothing moves it while they
        # wait); a Pilot-Commit pilot row was sampled a few updates before, and counts as the
        # recipe counts it, as if from the current policy.
        grad_L, _ = grpo_policy_gradient(
            theta_L,
            level_G,
            offset_G,
            group_of_row[uniform_slot_R],
            held.success.reshape(num_slots),
            jnp.ones((num_prompts,), jnp.float32),
            **gradient_options,
        )
        # A partial buffer's empty groups have no rollouts: as the trainer's loss normaliser
        # counts the filled groups' tokens only, the mean is over the filled groups' slots.
        return grad_L * (num_prompts / jnp.maximum(jnp.sum(filtered.filled), 1))

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

        example_groups = None
        if group_filters:  # a buffer shaped by one round's groups
            example_groups = BufferedGroups(
                success=jnp.zeros((num_prompts, config.n_mean), bool),
                level=jnp.zeros((num_prompts,), jnp.int32),
                offset=jnp.zeros((num_prompts,), jnp.float32),
            )
        state = SimState(
            theta=theta_L,
            opt_state=optimizer.init(theta_L),
            controllers=decisions.init(example_groups),
        )

        def step(state: SimState, inputs: tuple[jax.Array, jax.Array]):
            step_index, step_key = inputs
            allocate_key, rollout_key = jax.random.split(step_key)
            applied_parts = applied(flags)
            # Plan from history up to t-1 (SPEC 3, timing). A batch's draw (a prompt sampler's,
            # or Prompt-GDRO's resample) takes a key folded from the step's, so the other keys
            # stay those of the GDRO program.
            keys = PlanKeys(draw=jax.random.fold_in(step_key, 1), allocate=allocate_key)
            plan = decisions.plan(
                state.controllers, batch_ids(order_ED, step_index), keys, applied=applied_parts
            )
            ids_N, bins_N, n_N = plan.prompt_ids, plan.bins, plan.num_rollouts
            level_N, offset_N = pool.level_P[ids_N], pool.offset_P[ids_N]
            # What every method logs: what the GDRO parts would play on this batch.
            q_B = plan.reports["prompt_gdro"]["bin/q"]
            allocation = plan.reports["rollout_gdro"]
            count_B = per_group(jnp.ones_like(bins_N), bins_N, num_bins)

            # Roll out R Bernoulli samples and take the exact GRPO step.
            slot_R = plan.prompt_of_slot
            p_N = success_prob(state.theta, level_N, offset_N)
            success_R = jax.random.uniform(rollout_key, (num_slots,)) < p_N[slot_R]
            grad_L, stats = grpo_policy_gradient(
                state.theta,
                level_N,
                offset_N,
                slot_R,
                success_R,
                plan.advantage_weights,
                **gradient_options,
            )
            controllers_state = state.controllers
            updated = jnp.asarray(True)
            if group_filters:
                # The round's groups are N x n_mean slots: a group filter allocates nothing.
                success_NG = success_R.reshape(num_prompts, config.n_mean)
                reward_NG = jnp.where(success_NG, config.reward_correct, config.reward_wrong)
                groups = BufferedGroups(success_NG, level_N, offset_N)
                controllers_state, filtered = decisions.filter(
                    controllers_state, groups, reward_NG, plan=plan, applied=applied_parts
                )
                buffered_L = buffered_gradient(state.theta, filtered)
                grad_L = jnp.where(filtered.active, buffered_L, grad_L)
                updated = filtered.ready
            updates_L, opt_state = optimizer.update(-grad_L, state.opt_state, state.theta)
            theta_L = optax.apply_updates(state.theta, updates_L)
            if group_filters:
                # A waiting round leaves theta and the optimizer state (Adam's count) as they are.
                theta_L = jnp.where(updated, theta_L, state.theta)
                opt_state = jax.tree.map(
                    lambda new, old: jnp.where(updated, new, old), opt_state, state.opt_state
                )

            # Observe: the adversaries' loss signal (the trainer's) and the state transitions.
            losses_N = losses.prompt_loss_signal(
                config.loss_signal,
                prompt_of_slot_R=slot_R,
                num_prompts=num_prompts,
                logp_RT=logp_R1,
                old_logp_RT=logp_R1,
                adv_R=stats.advantage_R,
                mask_RT=mask_R1,
                correct_R=success_R,
            )
            controllers_state = decisions.update(
                controllers_state,
                plan,
                ids_N,
                num_correct=stats.num_correct_N,
                losses=losses_N,
            )

            pass1_L, pass_k_L = evaluate(state.theta, heldout)
            share_B = count_B / num_prompts
            record = StepRecord(
                q=q_B,
                scores=plan.reports["prompt_gdro"]["bin/score"],
                variance=allocation["bin/variance"],
                bin_count=count_B,
                rollouts_per_bin=per_group(n_N, bins_N, num_bins),
                rollouts_per_level=per_group(n_N, level_N - 1, num_levels),
                mu=allocation["mu"],
                lead_lag_gap=jnp.sum(bin_index_B * (q_B - share_B)),
                mean_reward=jnp.mean(
                    jnp.where(success_R, config.reward_correct, config.reward_wrong)
                ),
                informative_fraction=jnp.mean(stats.informative_N),
                tokens=jnp.sum(n_N * level_N),
                pass1=pass1_L,
                pass_k=pass_k_L,
                prompt_ids=ids_N,
                num_rollouts=n_N,
                num_correct=stats.num_correct_N,
                success_prob=p_N,
                theta=state.theta,
                updated=updated,
            )
            return SimState(theta_L, opt_state, controllers_state), record

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
            pool=pool,
        )

    options = {**(FAST_COMPILE_OPTIONS if fast_compile else {}), **(compiler_options or {})}
    batched = jax.jit(
        jax.vmap(run_seed, in_axes=(None, 0)),
        compiler_options=options or None,
    )

    def run(flags: MethodFlags, keys_S: jax.Array) -> SimOutput:
        check_flags(flags, parts)
        return batched(flags, keys_S)

    return Simulator(
        run_seed=run_seed,
        run=run,
        batched=batched,
        config=config,
        num_bins=num_bins,
        parts=parts,
        decisions=decisions,
        applied=applied,
    )


def seed_keys(num_seeds: int, seed: int = 0) -> jax.Array:
    """Returns `num_seeds` independent PRNG keys derived from `seed`."""
    return jax.random.split(jax.random.key(seed), num_seeds)


def simulate(
    config: SimConfig,
    methods: Sequence[str] = GDRO_METHODS,
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
      methods: names from `SIMULATED_METHODS` (every record of `controllers.METHODS`); the
        default, `GDRO_METHODS`, needs the GDRO parts only.
      num_seeds: seeds S, run in one vmapped call per method.
      seed: root seed of the S seed keys.
      progress: show a tqdm bar over methods.
      fast_compile: see `make_simulator`.
      simulator: a prebuilt `make_simulator(config, parts=...)` to reuse its compilation; without
        it one is built with `method_parts(methods)`, the union of the methods' parts.

    Returns:
      `{method: SimOutput}` of numpy arrays, each with a leading [S] axis.

    Raises:
      ValueError: an unknown method, or one whose part `simulator` was not compiled with.
    """
    parts = method_parts(methods)
    if simulator is None:
        simulator = make_simulator(config, parts=parts, fast_compile=fast_compile)
    flags = {method: method_flags(method, simulator.parts) for method in methods}
    keys_S = seed_keys(num_seeds, seed)
    outputs = {}
    for method in tqdm(methods, desc="methods", disable=not progress):
        result = simulator.run(flags[method], keys_S)
        outputs[method] = jax.tree.map(np.asarray, result)
    return outputs
