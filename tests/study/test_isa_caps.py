"""The committed measurement behind RESULTS.md's "Capping the instruction set": one graded run
(`prompt_gdro/seed_2`) trained on one machine four times, uncapped and under
`--xla_cpu_max_isa` SSE4_2, AVX and AVX2 (`results/isa_caps/<cap>/eval_test.json`).

What RESULTS.md states is read back from those files here: the uncapped run is the study's stored
run, the cap at the machine's own instruction set changes nothing, the lower caps change the
held-out figures, and the figures it quotes are the files' (frontier pass@8 recomputed from the
per-problem counts with the unbiased estimator written out here).
"""

import json
import math
from pathlib import Path

import pytest

from gdro_jax.study import warm_start_frontier

ROOT = Path(__file__).resolve().parents[2]
CAPS = ROOT / "results" / "isa_caps"
STUDY = ROOT / "results" / "study_graded" / "runs"
RESULTS = ROOT / "RESULTS.md"
# The figures RESULTS.md quotes: frontier pass@8 of each run.
QUOTED_FRONTIER_PASS8 = {"native": 0.7613, "SSE4_2": 0.7593, "AVX": 0.7600, "AVX2": 0.7613}
TIMING = ("seconds", "environment")


def _run(cap: str) -> dict:
    return json.loads((CAPS / cap / "eval_test.json").read_text())


def _without_timing(record: dict) -> dict:
    return {name: value for name, value in record.items() if name not in TIMING}


def _pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_each_file_records_its_cap_and_the_machine():
    for cap in QUOTED_FRONTIER_PASS8:
        environment = _run(cap)["environment"]
        flags = environment["xla_flags"]
        if cap == "native":
            assert "xla_cpu_max_isa" not in flags, flags
        else:
            assert flags == f"--xla_cpu_max_isa={cap}", (cap, flags)
        # One machine, an AVX2 one without AVX-512: the AVX2 cap is its own instruction set.
        extensions = environment["cpu"]["vector_extensions"]
        assert "avx2" in extensions and not any(e.startswith("avx512") for e in extensions)
        assert environment["commit"] == _run("native")["environment"]["commit"]


def test_the_uncapped_run_is_the_studys_stored_run():
    stored = json.loads((STUDY / "prompt_gdro" / "seed_2" / "eval_test.json").read_text())
    assert _without_timing(_run("native")) == _without_timing(stored)


def test_a_cap_at_the_machines_own_set_changes_nothing_and_lower_caps_change_the_figures():
    native = _without_timing(_run("native"))
    assert _without_timing(_run("AVX2")) == native
    for cap in ("SSE4_2", "AVX"):
        run = _without_timing(_run(cap))
        assert run["evaluation"]["correct"] != native["evaluation"]["correct"], cap
        assert run["sampled_tokens"] == native["sampled_tokens"]  # equal rollouts, as every run


@pytest.mark.parametrize("cap", list(QUOTED_FRONTIER_PASS8))
def test_the_quoted_frontier_pass8_is_the_files(cap):
    levels, k = warm_start_frontier(STUDY / "warm_start")
    evaluation = _run(cap)["evaluation"]
    n = evaluation["num_samples"]
    chosen = [
        c
        for c, level in zip(evaluation["correct"], evaluation["problem_levels"], strict=True)
        if level in levels
    ]
    value = sum(_pass_at_k(n, c, k) for c in chosen) / len(chosen)
    assert round(value, 4) == QUOTED_FRONTIER_PASS8[cap], (cap, value)
    # ... and RESULTS.md's table row of that cap quotes it.
    flag = "none (AVX2)" if cap == "native" else f"`--xla_cpu_max_isa={cap}`"
    lines = [line.strip() for line in RESULTS.read_text().splitlines()]
    rows = [line for line in lines if line.startswith(f"| {flag} |")]
    assert len(rows) == 1 and f"| {QUOTED_FRONTIER_PASS8[cap]:.4f} |" in rows[0], (cap, rows)
