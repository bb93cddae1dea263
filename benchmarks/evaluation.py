"""Math evaluation wall time, split into sampling, decoding and grading.

`gdro_jax.eval.evaluate_math` on a tiny random Qwen3 (2 layers, D=64, the tokenizer from
`data.build_tokenizer` trained on 200 MATH500 problems, V=512) over the first `--problems`
MATH500 problems x `--samples` samples at the paper's settings (T=0.6, top-p 0.8, top-k 20),
chat-templated prompts. The evaluation runs twice in one process into fresh folders: "cold"
includes the sampler's compilation and the grader's start-up, "warm" reuses both.

A random policy never writes `\\boxed{}`, so its grading is extraction only (every item is
"no answer"); the `--graded-completions` row grades as many real completions
(`grader_test_completions.jsonl`, Qwen2.5-Math outputs) with the same grader, for the cost of
math-verify on real answers.

Run:  python -m benchmarks.evaluation [--problems 20 --samples 8 --max-new-tokens 256]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import tempfile
import time

import jax

from gdro_jax import data, models, rewards
from gdro_jax import eval as evaluation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=20)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4, help="problems per sampler call")
    parser.add_argument("--workers", type=int, default=1, help="grading worker processes")
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()

    math500 = data.load_preset("math500", args.data_dir, suffix=None)
    tokenizer = data.build_tokenizer([row["problem"] for row in math500[:200]], vocab_size=512)
    config = models.DecoderConfig.tiny(
        vocab_size=len(tokenizer), eos_token_ids=(tokenizer.eos_token_id,)
    )
    model = models.init_decoder(config, seed=0)
    rows = data.load_preset("math500", args.data_dir, tokenizer=tokenizer)[: args.problems]
    settings = evaluation.EvalSettings(
        num_samples=args.samples, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size
    )
    print(
        f"jax {jax.__version__} ({jax.default_backend()}), {platform.machine()}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
        f"{args.problems} MATH500 problems x {args.samples} samples, "
        f"{args.max_new_tokens} new tokens at most, batch {args.batch_size} problems "
        f"({args.batch_size * args.samples} sequences), {args.workers} grading worker(s)"
    )
    print(
        "| run | total s | sampling s (first call) | tokens sampled | sampled tok/s | "
        "decoding s | grading s | grader start-up s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    start = time.perf_counter()
    with rewards.MathGrader(args.workers, 5.0) as grader:
        for run in ("cold", "warm"):
            with tempfile.TemporaryDirectory() as out:
                if run == "warm":
                    start = time.perf_counter()
                else:
                    tick = time.perf_counter()
                    grader.wait_ready()
                    startup_s = time.perf_counter() - tick
                result = evaluation.evaluate_math(
                    model,
                    tokenizer,
                    {"math500": rows},
                    grader=grader,
                    out_dir=out,
                    settings=settings,
                    progress=False,
                )
                total_s = time.perf_counter() - start
                lengths = [
                    json.loads(line)["lengths"] for line in open(os.path.join(out, "samples.jsonl"))
                ]
            t = result.timing
            tokens = sum(itertools.chain.from_iterable(lengths))
            print(
                f"| {run} | {total_s:.2f} | {t['sampling_s']:.2f} ({t['first_call_s']:.2f}) | "
                f"{tokens} | {tokens / t['sampling_s']:.0f} | {t['decoding_s']:.3f} | "
                f"{t['grading_s']:.3f} | {startup_s if run == 'cold' else 0.0:.2f} |"
            )
        # Real completions, same count, same grader (warm).
        labelled = data.read_jsonl(
            data.resolve_data_dir(args.data_dir) / "grader_test_completions.jsonl",
            fields=data.FieldNames(prompt="problem", answer="answer", id="id"),
        )[: args.problems * args.samples]
        tick = time.perf_counter()
        grader.grade([row["completion"] for row in labelled], [row["answer"] for row in labelled])
        graded_s = time.perf_counter() - tick
        print(
            f"\nGrading {len(labelled)} real completions (grader_test_completions.jsonl) with "
            f"the same grader: {graded_s:.3f} s ({len(labelled) / graded_s:.0f} items/s)."
        )


if __name__ == "__main__":
    main()
