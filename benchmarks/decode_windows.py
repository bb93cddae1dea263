"""Decode reads what is live: the decode windows (`sampling.window_ends`) on a CPU.

Two measurements, one run, on a small Qwen3 shape (random weights, float32: D=256, 2 layers,
4/2 heads of 64, F=768, V=4096):

  bytes    XLA's cost analysis ("bytes accessed") of one compiled decode step of 64 slots
           (forward through the KV cache, the output projection, the token draw), P = 256 and
           M = 512, at a live length of P + M/2: the step over the windows that hold it (the
           last step of a window), the step after it (the first of the next window, which
           reads that window whole), and the step over the whole P + M cache (the sampler
           before windows), each against the least bytes a step must read (the weights once
           plus its live keys and values), and split by kind: the KV cache, the weights,
           gathers (which XLA counts at their whole operand) and the rest (activations).
  wall     the same completions sampled with a cap of 1,024 tokens and of 128 (stop ids that a
           random policy draws often enough that every completion stops within 128 tokens;
           checked), 256 slots of 32 prompts (64-token prompts) in static chunks of 64, with
           windows (automatic, 128 tokens) and with one window of P + M (the sampler before
           windows): the wall-time ratio cap 1,024 / cap 128 of each, median of the repeats.
           `--batching=continuous`: 64 lanes taking the 256 requests from a queue instead, their
           ring of completion slots in the same windows (blocks no live request has written
           into skipped) or in one.

Run:  python -m benchmarks.decode_windows [--repeats=3] [--out=windows.json]
          [--batching=static|continuous] [--no-wall]
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import rollout_engines
from gdro_jax import models
from gdro_jax.sampling import generate, sample_logits, window_ends

# The engines benchmark's policy, with room for a 1,024-token cap after 64-token prompts.
POLICY = rollout_engines.POLICY.replace(max_position_embeddings=4096)
STEP_SLOTS, STEP_PROMPT, STEP_NEW = 64, 256, 512


def _step_cost(
    model: models.Decoder, slots: int, blocks: tuple[int, ...]
) -> tuple[float, dict[str, float] | None]:
    """Bytes accessed by one compiled decode step of `slots` slots over a KV cache in `blocks`
    (slots per block; the step writes into the last, as the sampler's window does), the
    per-layer weights sliced outside and the cache updated in place, as in the sampler's loop;
    and those bytes by kind (`bytes_by_kind`)."""
    graphdef, state = nnx.split((model, model.layer_slices()))

    # The cache donated, as the loop's carry is updated in place: without it the untouched
    # blocks are copied to the output and counted.
    @functools.partial(jax.jit, donate_argnums=1)
    def step(state, cache, tokens_C, positions_C, key_mask_CS, index, key):
        model, layers = nnx.merge(graphdef, state)
        h_C1D, cache = model.extend_cache(
            tokens_C[:, None],
            positions_C[:, None],
            cache=cache,
            cache_index=index,
            key_mask_BS=key_mask_CS,
            layers=layers,
        )
        token_C, logprob_C = sample_logits(model.logits(h_C1D)[:, 0], key, temperature=1.0)
        return token_C, logprob_C, cache

    parts = [jax.eval_shape(lambda n=n: model.init_cache(slots, n)) for n in blocks]
    cache = models.KVCache(
        k=tuple(tuple(part.k[i] for part in parts) for i in range(model.config.num_layers)),
        v=tuple(tuple(part.v[i] for part in parts) for i in range(model.config.num_layers)),
    )
    args = (
        state,
        cache,
        jax.ShapeDtypeStruct((slots,), jnp.int32),
        jax.ShapeDtypeStruct((slots,), jnp.int32),
        jax.ShapeDtypeStruct((slots, sum(blocks)), bool),
        jax.ShapeDtypeStruct((), jnp.int32),
        jax.random.key(0),
    )
    compiled = step.lower(*args).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["bytes accessed"]), bytes_by_kind(compiled.as_text())


# A top-level instruction of an optimised HLO module: name, result shape, opcode, the rest.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\([^()]*\)|\S+) ([\w\-]+)\((.*)$")
_CALLED = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=(\{[^}]*\}|%[\w.\-]+)")


def bytes_by_kind(hlo: str) -> dict[str, float] | None:
    """XLA's bytes accessed of a compiled step (its optimised HLO text), split by what each
    operation reads and writes: the KV cache, the weights, gathers, and the rest (activations:
    hidden states, attention scores, logits).

    Each top-level operation is costed alone by XLA's own cost analysis, so the parts sum to the
    step's figure (but for the few bytes of constants and tuples, left out). A gather that XLA
    fuses with other work is counted at its whole operand (the embedding table for a lookup of
    64 rows), whatever rows it reads: the bytes of every operation holding a gather are
    "gathers". Uses jax's internal HLO bindings;
    None where they are missing.
    """
    try:
        from jax._src.lib import _jax
        from jaxlib import _hlo
    except ImportError:
        return None
    computations, current, entry = {}, None, None
    for line in hlo.splitlines():
        if line.endswith("{") and not line.startswith(" ") and "%" in line.split(" (")[0]:
            current = re.match(r"^(?:ENTRY )?%([\w.\-]+)", line).group(1)
            entry = current if line.startswith("ENTRY") else entry
            computations[current] = [line]
        elif current:
            computations[current].append(line)
            current = None if line.startswith("}") else current
    shapes = {}
    for lines in computations.values():
        for match in filter(None, map(_INSTRUCTION.match, lines)):
            shapes[match.group(1)] = match.group(2)

    def called(text: str, found: list[str]) -> list[str]:
        for group in _CALLED.findall(text):
            for name in re.findall(r"%([\w.\-]+)", group):
                if name not in found:
                    found.append(name)
                    called("\n".join(computations[name]), found)
        return found

    client = jax.devices("cpu")[0].client
    kinds = dict.fromkeys(("kv_cache", "weights", "gathers", "rest"), 0.0)
    holds = {}  # what an entry parameter, or a cache block written in place, holds
    for match in filter(None, map(_INSTRUCTION.match, computations[entry][1:-1])):
        name, shape, opcode, tail = match.groups()
        depth, end = 1, 0
        while depth:  # the operand list, up to its closing parenthesis
            depth += {"(": 1, ")": -1}.get(tail[end], 0)
            end += 1
        operands = re.findall(r"%([\w.\-]+)", tail[: end - 1])
        if opcode == "parameter":
            holds[name] = "kv_cache" if name.startswith("cache") else "weights"
        elif opcode == "bitcast" and operands[0] in holds:
            holds[name] = holds[operands[0]]  # a view of it
        if opcode in ("parameter", "constant", "bitcast", "get-tuple-element", "tuple"):
            continue
        if "dynamic-update-slice" in name and holds.get(operands[0]) == "kv_cache":
            holds[name] = "kv_cache"  # what reads the written block reads the cache
        attributes = re.sub(r", metadata=\{[^}]*\}", "", tail[end:])
        renamed = tail[: end - 1]
        for i, operand in enumerate(operands):
            renamed = re.sub(rf"%{re.escape(operand)}\b", f"%p{i}", renamed, count=1)
        bodies = ["\n".join(computations[c]) for c in reversed(called(attributes, []))]
        module = "HloModule one\n\n" + "\n\n".join(bodies)
        module += "\n\nENTRY %one {\n" + "".join(
            f"  %p{i} = {shapes[o]} parameter({i})\n" for i, o in enumerate(operands)
        )
        module += f"  ROOT %r = {shape} {opcode}({renamed}){attributes}\n}}\n"
        cost = _jax.hlo_module_cost_analysis(client, _hlo.hlo_module_from_text(module))
        total = cost["bytes accessed"]
        if opcode == "gather" or any(" gather(" in body for body in bodies):
            kinds["gathers"] += total
            continue
        # The reads of cache and weights operands by their keys ("bytes accessed<i>{}"; a
        # fusion may also report keys of its fused work, past its operands); the rest of the
        # operation's figure is activations.
        read = 0.0
        for key, value in cost.items():
            index = key.removeprefix("bytes accessed").split("{")[0]
            if key.startswith("bytes accessed") and index.isdigit() and int(index) < len(operands):
                kind = holds.get(operands[int(index)])
                if kind is not None:
                    kinds[kind] += value
                    read += value
        kinds["rest"] += total - read
    return kinds


def bytes_per_step(model: models.Decoder) -> dict:
    """The decode step's bytes at live length P + M/2, against the least, over the sampler's
    blocks and over one P + M cache (the sampler before windows).

    Step t writes completion slot t - 1 and reads P + t positions. Step M/2 reads the live
    P + M/2, the last step of its window here (M/2 is a window's end): its blocks hold exactly
    what is live. Step M/2 + 1 is the first of the next window, whose block it reads whole:
    a window's worst rounding. Each is set against its own least bytes.
    """
    config = model.config
    itemsize = jnp.dtype(config.compute_dtype).itemsize
    weights = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) * itemsize
    per_position = 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize
    ends = window_ends(STEP_NEW)
    out = {
        "slots": STEP_SLOTS,
        "prompt": STEP_PROMPT,
        "max_new_tokens": STEP_NEW,
        "weights_bytes": weights,
    }

    def window_blocks(t: int) -> tuple[int, ...]:
        """The blocks step t reads: those up to the window holding its completion slot."""
        index = next(i for i, end in enumerate(ends) if end >= t)
        later = zip(ends[:index], ends[1 : index + 1], strict=True)
        return (STEP_PROMPT + ends[0], *(b - a for a, b in later))

    half = STEP_NEW // 2
    steps = {
        "window": (half, window_blocks(half)),
        "window_opened": (half + 1, window_blocks(half + 1)),
        "whole": (half, (STEP_PROMPT + STEP_NEW,)),
    }
    for name, (t, blocks) in steps.items():
        least = weights + STEP_SLOTS * (STEP_PROMPT + t) * per_position
        accessed, kinds = _step_cost(model, STEP_SLOTS, blocks)
        out[name] = {
            "step": t,
            "live_positions": STEP_PROMPT + t,
            "least_bytes": least,
            "cache_slots": sum(blocks),
            "blocks": list(blocks),
            "bytes": accessed,
            "over_least": accessed / least,
            "bytes_by_kind": kinds,
        }
    return out


def _workload(seed: int = 0):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, POLICY.vocab_size, 64).tolist() for _ in range(32)]
    # 8 % of the vocabulary stops: a completion runs past 128 tokens with chance 0.92^128 = 2e-5.
    eos = tuple(range(10, 10 + int(0.08 * POLICY.vocab_size)))
    return prompts, np.repeat(np.arange(32, dtype=np.int32), 8), eos


def wall_ratio(model: models.Decoder, repeats: int, batching: str = "static") -> dict:
    """Cap 1,024 against cap 128 on completions that all stop within 128 tokens (`batching`:
    static chunks of 64 slots, or 64 continuous lanes)."""
    prompts, slots, eos = _workload()

    def run(cap: int, window: int):
        start = time.perf_counter()
        result = generate(
            model,
            prompts,
            key=jax.random.key(1),
            max_new_tokens=cap,
            prompt_of_slot=slots,
            prompt_bucket=64,
            eos_ids=eos,
            micro_batch_slots=64,
            batching=batching,
            decode_window=window,
        )
        jax.block_until_ready(result.tokens)
        return result, time.perf_counter() - start

    out, differ = {}, {}
    reference = None
    for name, window in (("windows", 0), ("one window", None)):
        seconds = {}
        for cap in (128, 1024):
            size = cap if window is None else window  # None: one window of P + cap
            result, _ = run(cap, size)  # compiles
            lengths = np.asarray(result.lengths)
            if lengths.max() >= 128:
                raise RuntimeError(f"a completion ran to {lengths.max()} tokens: not the workload")
            tokens = np.asarray(result.tokens)[:, :128]
            if reference is None:
                reference = tokens
            # Completions that differ from the first run's: the same keys, logits rounded
            # otherwise by programs of other shapes (a near-uniform random policy's draws flip
            # on a rounding now and then).
            differ[f"{name}, cap {cap}"] = int(np.sum(np.any(tokens != reference, axis=1)))
            seconds[cap] = float(np.median([run(cap, size)[1] for _ in range(repeats)]))
        out[name] = {
            "seconds_cap_128": seconds[128],
            "seconds_cap_1024": seconds[1024],
            "ratio": seconds[1024] / seconds[128],
        }
    out["completions_differing_from_the_first_run"] = differ
    out["completion_tokens"] = int(lengths.sum())
    out["longest"] = int(lengths.max())
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--batching", choices=("static", "continuous"), default="static",
        help="the wall measurement's loop: static chunks of 64 slots or 64 continuous lanes",
    )  # fmt: skip
    parser.add_argument("--no-wall", action="store_true", help="the bytes per step only")
    args = parser.parse_args()
    model = models.init_decoder(POLICY, seed=0)
    results = {
        "bytes": bytes_per_step(model),
        "batching": args.batching,
        "wall": None if args.no_wall else wall_ratio(model, args.repeats, args.batching),
    }
    for name in ("window", "window_opened", "whole"):
        b = results["bytes"][name]
        print(
            f"bytes per decode step, {name}: step {b['step']}, live {b['live_positions']} of "
            f"{STEP_SLOTS} slots, cache {b['cache_slots']} slots {b['blocks']}: "
            f"{b['bytes'] / 2**20:.1f} MiB, least {b['least_bytes'] / 2**20:.1f} MiB, "
            f"{b['over_least']:.2f}x"
        )
        if b["bytes_by_kind"]:
            print("  " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in b["bytes_by_kind"].items()))
    for name in ("windows", "one window") if results["wall"] else ():
        w = results["wall"][name]
        print(
            f"{name}: cap 1,024 {w['seconds_cap_1024']:.2f} s, cap 128 "
            f"{w['seconds_cap_128']:.2f} s, ratio {w['ratio']:.2f}x (longest completion "
            f"{results['wall']['longest']})"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
