"""`benchmarks/accelerator.py` on CPU: the `--shape=tiny` smoke run's JSON figures against counts
written out here from the tiny config, the one-line refusals, and how a run treats its sections
(with stand-in measurements): the JSON rewritten after each, a failure named while the others
run, no section begun past `--budget-s`."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from benchmarks import accelerator
from gdro_jax import models

REPO_ROOT = Path(__file__).resolve().parents[1]
PEAK_TFLOPS, PEAK_HBM_GBS = 2.0, 50.0
SECTIONS = {
    "update": (
        "compile_s", "median_s", "times_s", "slots", "minibatches", "prompt_len", "new_tokens",
        "tokens", "reference_forward", "remat_policy", "logprob_chunk_tokens", "model_flops",
        "flops_per_s", "mfu",
    ),
    "decode": (
        "compile_s", "median_s", "times_s", "slots", "prompt_len", "new_tokens", "tokens",
        "tokens_per_s", "least_bytes", "roofline_fraction",
    ),
    "prefill_sharing": (
        "slots", "prompts", "prompt_len", "new_tokens", "shared", "per_slot", "speedup",
    ),
    "live": ("slots", "prompt_len", "caps", "windows", "timing", "ranges",
             "one_window_over_windows", "stop_check_every", "checks_speedup"),
    "engines": ("slots", "prompts", "lanes", "workloads"),
    "packed": ("slots", "prompt_len", "new_tokens", "pass_rows", "real_tokens", "padded_tokens",
               "packed_rows", "packed_compiles", "padded", "packed", "speedup"),
    "attention": ("skipped",),  # cuDNN's path needs a GPU
    "update_candidates": ("candidates",),
}  # fmt: skip
TOP_LEVEL = (
    "shape", "device_kind", "platform", "jax_version", "repeats", "model", "param_count",
    "matmul_weights", "param_dtype", "compute_dtype", "peak_flops", "peak_hbm_bytes_per_s",
    "peaks_from", "complete", "section_seconds", *SECTIONS,
)  # fmt: skip


def _run(*argv, **env):
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.accelerator", *argv],
        cwd=REPO_ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu", **env),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("accelerator") / "figures.json"
    completed = _run(
        "--shape=tiny",
        "--repeats=2",
        f"--out={out}",
        f"--peak-tflops={PEAK_TFLOPS}",
        f"--peak-hbm-gbs={PEAK_HBM_GBS}",
        # Every section: the default ones and the update's candidates, asked for by name.
        "--sections=" + ",".join(accelerator.ALL_SECTIONS),
        # Only the figures' relations are asserted, not their values: compile a third faster.
        JAX_DISABLE_MOST_OPTIMIZATIONS="1",
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(out.read_text()), completed.stdout


def _positive_finite(value):
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_the_report_holds_every_figure_and_prints_the_table(run):
    report, printed = run
    assert set(TOP_LEVEL) <= set(report)
    for section, keys in SECTIONS.items():
        assert set(keys) <= set(report[section]), section
    assert report["shape"] == "tiny" and report["platform"] == "cpu" and report["repeats"] == 2
    assert report["complete"] is True
    assert set(report["section_seconds"]) == set(accelerator.ALL_SECTIONS)
    assert all(map(_positive_finite, report["section_seconds"].values()))
    assert (report["param_dtype"], report["compute_dtype"]) == ("float32", "bfloat16")
    assert report["peak_flops"] == PEAK_TFLOPS * 1e12
    assert report["peak_hbm_bytes_per_s"] == PEAK_HBM_GBS * 1e9
    for timing in (report["update"], report["decode"], *(report["prefill_sharing"][k]
                   for k in ("shared", "per_slot"))):  # fmt: skip
        assert len(timing["times_s"]) == 2 and all(map(_positive_finite, timing["times_s"]))
        assert _positive_finite(timing["median_s"]) and timing["compile_s"] >= 0
    for row in ("| update", "| decode", "| prefill shared / per slot", "MFU ", "HBM roofline "):
        assert row in printed


@pytest.mark.slow
def test_update_flops_and_mfu_match_a_hand_count_from_the_tiny_config(run):
    report, _ = run
    c = models.DecoderConfig.tiny()
    assert report["model"]["d_model"] == c.d_model and report["model"]["vocab_size"] == c.vocab_size
    V, D, L, N, K, H, F = (
        c.vocab_size, c.d_model, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_dim
    )  # fmt: skip
    # Matmul weights per layer: q [D, N*H], k and v [D, K*H], o [N*H, D], gate/up [D, F], down
    # [F, D]; plus the tied output projection [D, V].
    per_layer = D * N * H + 2 * D * K * H + N * H * D + 3 * D * F
    weights = L * per_layer + V * D
    assert report["matmul_weights"] == weights
    # All parameters: the same plus four norm scales per layer (2 of D, q/k of H), the final norm.
    assert report["param_count"] == L * (per_layer + 2 * D + 2 * H) + V * D + D

    update = report["update"]
    R, T = update["slots"], update["prompt_len"] + update["new_tokens"]
    assert R == 16 and T == 32 and update["tokens"] == R * T
    dense_forward = 2 * weights * R * T  # a multiply-add is 2 FLOPs
    attention_forward = R * L * N * (2 * T * T * H + 2 * T * T * H)  # QK^T, then AV
    # Forward + backward (twice the forward) of the policy, plus the KL reference's forward.
    assert update["reference_forward"] is True
    expected = 4 * (dense_forward + attention_forward)
    assert update["model_flops"] == expected
    mfu = expected / update["median_s"] / (PEAK_TFLOPS * 1e12)
    assert update["mfu"] == pytest.approx(mfu, rel=1e-9)
    assert math.isfinite(update["mfu"]) and update["mfu"] > 0


@pytest.mark.slow
def test_decode_throughput_and_roofline_fraction(run):
    report, _ = run
    decode, c = report["decode"], models.DecoderConfig.tiny()
    R, P, M = decode["slots"], decode["prompt_len"], decode["new_tokens"]
    assert decode["tokens"] == R * M  # no stop id: every slot generates M tokens
    assert _positive_finite(decode["tokens_per_s"])
    assert decode["tokens_per_s"] == pytest.approx(R * M / decode["median_s"], rel=1e-9)
    bf16 = 2  # bytes
    kv_bytes_per_position = 2 * c.num_layers * c.num_kv_heads * c.head_dim * bf16
    least = sum(
        report["param_count"] * bf16 + R * (P + t) * kv_bytes_per_position for t in range(1, M)
    )
    assert decode["least_bytes"] == least
    # On CPU the fraction of a made-up bandwidth need not be <= 1, only well defined.
    assert _positive_finite(decode["roofline_fraction"])
    fraction = least / (PEAK_HBM_GBS * 1e9) / decode["median_s"]
    assert decode["roofline_fraction"] == pytest.approx(fraction, rel=1e-9)


@pytest.mark.slow
def test_prefill_sharing_speedup_is_the_ratio_of_medians(run):
    report, _ = run
    sharing = report["prefill_sharing"]
    assert _positive_finite(sharing["speedup"])
    ratio = sharing["per_slot"]["median_s"] / sharing["shared"]["median_s"]
    assert sharing["speedup"] == pytest.approx(ratio, rel=1e-9)
    assert sharing["slots"] == sharing["prompts"] * 4


@pytest.mark.slow
def test_live_lengths_cost_per_step_is_the_slope_between_caps(run):
    report, printed = run
    live = report["live"]
    caps, timing = live["caps"], live["timing"]
    # Windows of the first cap's size: the static loop's cache grows by that much each time.
    assert live["windows"] == list(range(caps[0], caps[-1] + 1, caps[0]))
    medians = {cap: timing[f"cap_{cap}"]["median_s"] for cap in caps}
    previous = (0, 0.0)
    for entry, cap in zip(live["ranges"], caps, strict=True):
        low, seconds = previous
        assert entry["steps"] == [low, cap]
        assert entry["live_len"] == live["prompt_len"] + (low + cap) / 2
        assert entry["ms_per_step"] == pytest.approx(1e3 * (medians[cap] - seconds) / (cap - low))
        previous = (cap, medians[cap])
    ratio = timing["one_window"]["median_s"] / medians[caps[-1]]
    assert live["one_window_over_windows"] == pytest.approx(ratio, rel=1e-9)
    checks = timing[f"checks_every_{live['stop_check_every']}"]["median_s"]
    assert live["checks_speedup"] == pytest.approx(medians[caps[-1]] / checks, rel=1e-9)
    assert "ms per step" in printed and "one window" in printed


@pytest.mark.slow
def test_engines_rows_count_each_batchings_own_tokens(run):
    report, printed = run
    engines = report["engines"]
    assert engines["slots"] == 16 and engines["lanes"] == 8
    assert set(engines["workloads"]) == {"uneven", "long_tail", "at_cap"}
    for name, row in engines["workloads"].items():
        every = name in accelerator.ALL_BLOCKS_WORKLOADS
        assert ("continuous_all_blocks" in row) == every, name
        for form in ("static", "continuous", "continuous_all_blocks")[: 3 if every else 2]:
            entry = row[form]
            assert 0 < entry["tokens"] <= engines["slots"] * row["new_tokens"], (name, form)
            rate = entry["tokens"] / entry["median_s"]
            assert entry["tokens_per_s"] == pytest.approx(rate, rel=1e-9)
        ratio = row["continuous"]["tokens_per_s"] / row["static"]["tokens_per_s"]
        assert row["continuous_over_static"] == pytest.approx(ratio, rel=1e-9)
        if every:
            ratio = row["continuous_all_blocks"]["tokens_per_s"] / row["continuous"]["tokens_per_s"]
            assert row["all_blocks_over_skipping"] == pytest.approx(ratio, rel=1e-9)
        assert f"| {name} |" in printed
    # No stop id: every request of both batchings runs to the cap.
    at_cap = engines["workloads"]["at_cap"]
    for form in ("static", "continuous"):
        assert at_cap[form]["at_cap_fraction"] == 1.0
        assert at_cap[form]["tokens"] == engines["slots"] * at_cap["new_tokens"]
    # Stop ids drawn with a few percent a token: most requests stop before the cap.
    assert engines["workloads"]["uneven"]["static"]["at_cap_fraction"] < 0.5


@pytest.mark.slow
def test_packed_update_compiles_once_and_counts_real_tokens(run):
    report, _ = run
    packed = report["packed"]
    P, M = packed["prompt_len"], packed["new_tokens"]
    assert packed["padded_tokens"] == packed["slots"] * (P + M)
    # Real tokens are at most the padded ones and fit in the rows the packing used.
    assert 0 < packed["real_tokens"] <= packed["packed_rows"] * (P + M) < packed["padded_tokens"]
    assert packed["packed_compiles"] == 1  # the same program over three length draws
    for form in ("padded", "packed"):
        rate = packed["real_tokens"] / packed[form]["median_s"]
        assert packed[form]["real_tokens_per_s"] == pytest.approx(rate, rel=1e-9)
    ratio = packed["padded"]["median_s"] / packed["packed"]["median_s"]
    assert packed["speedup"] == pytest.approx(ratio, rel=1e-9)


@pytest.mark.slow
def test_update_candidates_run_the_same_work_with_their_fields_changed(run):
    """Each candidate is the update section's work (the same model FLOPs) with the run-config
    fields it names changed, as the update read them back; the table prints each row."""
    report, printed = run
    update, candidates = report["update"], report["update_candidates"]["candidates"]
    assert set(candidates) == set(accelerator.UPDATE_CANDIDATES)
    assert (update["remat_policy"], update["logprob_chunk_tokens"]) == ("nothing", 1024)
    settings = {
        "model.remat_policy": "remat_policy",
        "grpo.logprob_chunk_tokens": "logprob_chunk_tokens",
    }
    for name, row in candidates.items():
        assert row["overrides"] == accelerator.UPDATE_CANDIDATES[name]
        for field, value in row["overrides"].items():
            assert row[settings[field]] == value, (name, field)
        unchanged = set(settings.values()) - {settings[field] for field in row["overrides"]}
        for key in unchanged:
            assert row[key] == update[key], (name, key)
        assert row["model_flops"] == update["model_flops"] and row["tokens"] == update["tokens"]
        mfu = row["model_flops"] / row["median_s"] / (PEAK_TFLOPS * 1e12)
        assert row["mfu"] == pytest.approx(mfu, rel=1e-9)
        assert f"| {name} |" in printed


@pytest.mark.slow
def test_attention_section_says_why_it_is_skipped_on_cpu(run):
    report, printed = run
    assert report["attention"] == dict(skipped="cuDNN attention needs a GPU (platform cpu)")
    assert "attention: skipped (cuDNN attention needs a GPU" in printed


def test_an_unknown_section_is_refused_in_one_line(tmp_path):
    completed = _run("--shape=tiny", "--sections=decode,warp")
    assert completed.returncode == 2, completed.stderr[-2000:]
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in completed.stderr, completed.stderr[-2000:]
    assert lines[0].startswith("error: --sections must name some of decode")
    assert "sections=['decode', 'warp']" in lines[0]


def test_without_shape_tiny_it_refuses_cpu_in_one_line(tmp_path):
    out = tmp_path / "figures.json"
    completed = _run(f"--out={out}")
    assert completed.returncode == 2, completed.stderr[-2000:]
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in completed.stderr, completed.stderr[-2000:]
    assert lines[0].startswith("error: ") and "--shape=tiny" in lines[0]
    assert "shape=qwen3_1p7b" in lines[0]
    assert not out.exists()


def _fake_runs(clock, seconds, calls, **raising):
    """A bench per section that takes `seconds` on the fake `clock`, records each call in
    `calls`, and raises `raising[name]` where given."""

    def bench(name):
        def run():
            calls.append(name)
            clock[0] += seconds
            if name in raising:
                raise raising[name]
            return dict(figure=len(calls))

        return run

    return {name: bench(name) for name in accelerator.ALL_SECTIONS}


def test_the_json_holds_every_finished_section_while_the_run_goes_on(tmp_path):
    """A chip session's call that is killed part-way keeps what it measured: when each section
    begins, the file already holds every section before it, and `complete` is false until the
    end."""
    out, clock, calls = tmp_path / "figures.json", [0.0], []
    runs, seen = _fake_runs(clock, 1.0, calls), {}
    for name, run in list(runs.items()):
        runs[name] = lambda run=run, name=name: (
            seen.setdefault(name, json.loads(out.read_text()) if out.exists() else None),
            run(),
        )[1]
    asked = ("decode", "live", "packed", "update")
    report = dict(shape="tiny")
    failed = accelerator.run_sections(
        runs, asked, report, repeats=1, out=str(out), clock=lambda: clock[0]
    )
    assert failed == [] and calls == list(asked)
    assert seen["decode"] is None  # nothing written before the first section ends
    for index, name in enumerate(asked[1:], start=1):
        done = {key: value for key, value in seen[name].items() if key in accelerator.ALL_SECTIONS}
        finished = {section: dict(figure=i + 1) for i, section in enumerate(asked[:index])}
        assert {k: v for k, v in done.items() if "skipped" not in v} == finished, name
        assert seen[name]["complete"] is False and seen[name]["shape"] == "tiny"
    final = json.loads(out.read_text())
    assert final["complete"] is True and final == report
    assert final["section_seconds"] == dict.fromkeys(asked, 1.0)
    assert final["prefill_sharing"] == dict(skipped="not asked")
    assert not (tmp_path / "figures.json.partial").exists()


def test_a_failing_section_is_named_and_the_others_still_run(tmp_path, capsys):
    clock, calls = [0.0], []
    out_of_memory = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory\nmore lines")
    runs = _fake_runs(
        clock, 1.0, calls, live=ValueError("bad shape\nsecond line"), update=out_of_memory
    )
    report = {}
    failed = accelerator.run_sections(
        runs, accelerator.SECTIONS, report, repeats=1, out=str(tmp_path / "f.json")
    )
    assert calls == list(accelerator.SECTIONS)  # every asked section ran, in order
    assert failed == ["live"]
    assert report["live"] == dict(skipped="failed: ValueError: bad shape", failed=True)
    assert report["update"] == dict(skipped="out of memory: RESOURCE_EXHAUSTED: Out of memory")
    assert report["packed"] == dict(figure=calls.index("packed") + 1)
    assert "Traceback" in capsys.readouterr().err
    assert json.loads((tmp_path / "f.json").read_text()) == report


def test_no_section_begins_past_the_budget():
    clock, calls = [0.0], []
    runs = _fake_runs(clock, 100.0, calls)
    report = {}
    accelerator.run_sections(
        runs, accelerator.SECTIONS, report, repeats=1, budget_s=250, clock=lambda: clock[0]
    )
    # Sections begin at 0, 100 and 200 s; the fourth would begin at 300.
    assert calls == list(accelerator.SECTIONS[:3])
    for name in accelerator.SECTIONS[3:]:
        assert report[name] == dict(skipped="not begun: 300 s had passed, --budget-s=250"), name
    assert report["section_seconds"] == dict.fromkeys(accelerator.SECTIONS[:3], 100.0)


def test_a_budget_of_zero_is_refused_in_one_line():
    completed = _run("--shape=tiny", "--budget-s=0")
    assert completed.returncode == 2, completed.stderr[-2000:]
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert lines == ["error: --budget-s must be > 0, got budget-s=0.0"], completed.stderr[-2000:]


def test_a_failing_update_candidate_fails_its_section_and_the_others_run(monkeypatch):
    def bench_update(candidate, model, shape, **_):
        if candidate.model.remat_policy == "dots":
            raise ValueError("candidate broke")
        return dict(median_s=1.0)

    monkeypatch.setattr(accelerator, "bench_update", bench_update)
    shape = accelerator.SHAPES["tiny"]
    section = accelerator.bench_update_candidates(
        accelerator.run_config(shape), shape, repeats=1, peak_flops=None
    )
    assert section["failed"] is True
    rows = section["candidates"]
    assert rows.pop("remat_dots") == dict(
        skipped="failed: ValueError: candidate broke",
        failed=True,
        overrides=accelerator.UPDATE_CANDIDATES["remat_dots"],
    )
    assert rows and all(
        row == dict(median_s=1.0, overrides=accelerator.UPDATE_CANDIDATES[name])
        for name, row in rows.items()
    )
