"""The tables of a finished comparison study (`format_tables`, over `collect`'s summary): what
`tables.md` and RESULTS.md's marked blocks hold.

Every table that compares arms shows its noise: the primary and secondary gains print their
paired bootstrap intervals, and the per-level and along-the-run tables mark each arm's cell by
its paired interval against the baseline ((+) above 0, (-) below, unmarked: within noise).
"""

from __future__ import annotations

import math
from typing import Any

MARKS_NOTE = (
    "(+) / (-): the paired {level} % interval of the arm's gain over `{base}` lies above / "
    "below 0 ({resamples}); unmarked: within noise. Each cell is tested alone: where nothing "
    "differs, about 1 cell in 20 is marked by chance."
)


def _pct(value: float) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:+.1f} %"


def _interval(g: dict | None) -> str:
    if g is None:
        return "n/a"
    return f"{_pct(g['gain'])} [{_pct(g['low'])}, {_pct(g['high'])}]"


def _mark(g: dict | None) -> str:
    """ " (+)" or " (-)" where the gain's interval excludes 0, "" within noise (or undefined)."""
    if g is None:
        return ""
    if g["low"] > 0:
        return " (+)"
    if g["high"] < 0:
        return " (-)"
    return ""


def _headline(summary: dict, primary_name: str, level: int) -> list[str]:
    """One row per arm: the primary gain with its interval and power, the pooled pass@1 gain,
    the groups with a non-zero gradient (after the first pass over the pool), the tokens and the
    rollouts to the baseline's final frontier pass@1."""
    base = summary["baseline"]
    training = summary["training"]
    along = summary.get("along", {}).get("arms", {})
    after = training[base]["after_step"]
    lines = [
        f"| arm | {primary_name} gain over {base} [{level} %] | detectable "
        f"| pooled pass@1 gain [{level} %] | groups with a non-zero gradient (steps > {after}) "
        f"| sampled tokens vs {base} | rollouts to {base}'s final frontier pass@1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in summary["arms"]:
        nonzero = training[arm]["nonzero_gradient_fraction"]["mean"]
        tokens = _pct(summary["token_ratio"][arm] - 1.0)
        reached = along.get(arm, {}).get("rollouts_to_baseline_final", "n/a")
        reached = "not reached" if reached is None else str(reached)
        if arm == base:
            cells = ["(baseline)", "", "", f"{nonzero:.3f}", tokens, reached]
        else:
            g = summary["primary"].get(arm)
            cells = [
                _interval(g),
                "n/a" if g is None else _pct(g["detectable_gain"]),
                _interval(summary["secondary"][arm].get("pooled pass@1")),
                f"{nonzero:.3f}",
                tokens,
                reached,
            ]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def _gain_of(summary: dict, arm: str, name: str, primary_name: str) -> dict | None:
    """The stored paired gain behind a per-level table cell (None: none stored)."""
    if name == primary_name:
        return summary["primary"].get(arm)
    if name in summary["secondary"].get(arm, {}):
        return summary["secondary"][arm][name]
    return summary.get("level_gains", {}).get(arm, {}).get(name)


def _machines(summary: dict) -> list[str]:
    """A line naming the machines that made the files (`collect`'s `environments`)."""
    environments = summary.get("environments")
    if environments is None:
        return []
    # Records that differ only in what the line does not show (the code's commit, the platform
    # string) make one entry: its files and the number of commits that made them.
    machines: dict[str, dict[str, Any]] = {}
    for group in environments["recorded"]:
        env, cpu = group["environment"], group["environment"]["cpu"]
        wide = [f for f in cpu["vector_extensions"] if f.startswith(("avx", "amx", "sve"))]
        packages = env["packages"]
        machine = (
            f"{cpu['model']} ({', '.join(wide) or 'no AVX/SVE read'}; {env['backend']} "
            f"{env['devices']['kind']}, jax {packages['jax']}, jaxlib {packages['jaxlib']}"
        )
        entry = machines.setdefault(machine, {"files": 0, "commits": set()})
        entry["files"] += len(group["runs"])
        entry["commits"].add(env.get("commit"))
    parts = []
    for machine, entry in machines.items():
        commits = len(entry["commits"] - {None})
        by = f"; {commits} commits of the code" if commits > 1 else ""
        parts.append(f"{entry['files']} on {machine}{by})")
    if environments["unrecorded"]:
        parts.append(
            f"{len(environments['unrecorded'])} with no record of their machine (made before "
            "result files recorded it)"
        )
    return ["", f"Files (runs and the warm start's evaluation): {'; '.join(parts)}."]


def format_tables(summary: dict) -> str:
    """Markdown: the primary table with intervals and power, per-seed figures, per-level means
    and the figures along the runs (marked against the baseline), secondary gains and token
    costs, and the machines that made the files."""
    k = summary["frontier_k"]
    declared = summary["primary_declaration"]
    metric = declared["metric"]
    scope = "frontier" if declared["levels"] == "frontier" else "pooled"
    primary_name = f"{scope} {metric}"
    base = summary["baseline"]
    frontier = ", ".join(f"L{lv}" for lv in summary["frontier_levels"]) or "none"
    seeds = summary["seeds"]
    level = int(round(100 * declared["confidence"]))
    where = (
        f"the frontier levels ({frontier}: the warm start's validation pass@{k} below 0.95)"
        if scope == "frontier"
        else "all levels"
    )
    lines = []
    if "training" in summary:
        lines += [*_headline(summary, primary_name, level), ""]
    lines += [
        f"Primary metric: relative {metric} gain over `{base}` on {where}, paired by seed, "
        f"paired bootstrap {level} % interval; {len(seeds)} seeds, "
        f"{summary['problems']['frontier']} frontier problems of {summary['problems']['total']} "
        f"on the {summary['split']} split.",
        "",
        f"| arm | {primary_name} (mean over seeds) | gain over {base} | {level} % interval "
        f"| detectable gain (80 % power) | sampled tokens vs {base} |",
        "|---|---|---|---|---|---|",
    ]
    for arm in summary["arms"]:
        mean = summary["mean"][arm][primary_name]
        tokens = _pct(summary["token_ratio"][arm] - 1.0)
        g = summary["primary"].get(arm)
        if arm == base:
            lines.append(f"| {arm} | {mean:.3f} | (baseline) | | | {tokens} |")
        elif g is None:
            lines.append(f"| {arm} | {mean:.3f} | n/a (baseline at 0) | | | {tokens} |")
        else:
            lines.append(
                f"| {arm} | {mean:.3f} | {_pct(g['gain'])} "
                f"| [{_pct(g['low'])}, {_pct(g['high'])}] "
                f"| {_pct(g['detectable_gain'])} | {tokens} |"
            )
    warm = summary["warm_start"][primary_name]
    lines += ["", f"Warm start: {primary_name} {warm:.3f}.", "", "Per seed:", ""]
    lines.append("| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |")
    lines.append("|---|" + "---|" * len(seeds))
    for arm in summary["arms"]:
        cells = [f"{summary['per_seed'][arm][str(s)][primary_name]:.3f}" for s in seeds]
        lines.append(f"| {arm} ({primary_name}) | " + " | ".join(cells) + " |")
    names = [n for n in summary["warm_start"] if n.startswith(("L", "pooled", "frontier"))]
    marked = "level_gains" in summary
    lines += ["", "Per level, mean over seeds (pass@1 is also mean@n, the fraction right):", ""]
    lines.append("| | warm start | " + " | ".join(summary["arms"]) + " |")
    lines.append("|---|---|" + "---|" * len(summary["arms"]))
    for name in names:
        cells = [
            f"{summary['mean'][arm][name]:.3f}"
            + ("" if arm == base else _mark(_gain_of(summary, arm, name, primary_name)))
            for arm in summary["arms"]
        ]
        lines.append(f"| {name} | {summary['warm_start'][name]:.3f} | " + " | ".join(cells) + " |")
    if marked:
        resamples = (
            "pooled and frontier rows: the gains below; levels: "
            f"{summary['mark_resamples']:,} resamples each"
        )
        lines += ["", MARKS_NOTE.format(level=level, base=base, resamples=resamples)]
    if "along" in summary:
        along = summary["along"]
        lines += [
            "",
            "Along the runs, mean over seeds (frontier pass@1 at equal sampled rollouts):",
        ]
        lines += ["", "| arm | " + " | ".join(str(r) for r in along["sampled_rollouts"])]
        lines[-1] += " | rollouts to the baseline's final |"
        lines.append("|---|" + "---|" * (len(along["sampled_rollouts"]) + 1))
        for arm, curve in along["arms"].items():
            gains = curve.get("frontier pass@1 gain", [None] * len(curve["frontier pass@1"]))
            cells = [
                f"{v:.3f}{_mark(g)}" for v, g in zip(curve["frontier pass@1"], gains, strict=True)
            ]
            reached = curve["rollouts_to_baseline_final"]
            cells.append("not reached" if reached is None else str(reached))
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        if any("frontier pass@1 gain" in curve for curve in along["arms"].values()):
            resamples = (
                f"against the baseline at the same point, {summary['mark_resamples']:,} resamples"
            )
            lines += ["", MARKS_NOTE.format(level=level, base=base, resamples=resamples)]
    if "steps" in summary.get("along", {}):
        lines += _along_primary(summary, level)
    lines += ["", f"Secondary gains over `{base}` (paired bootstrap {level} % intervals):", ""]
    for arm, gains in summary["secondary"].items():
        for name, g in gains.items():
            lines.append(f"- {arm}, {name}: {_interval(g)}")
    lines += _machines(summary)
    return "\n".join(lines)


def _along_primary(summary: dict, level: int) -> list[str]:
    """The tables of a study that declares its primary along the run (`along_primary`): the
    primary gain at every point with the change from the first point to the last and its
    reading, the points of the study it continues (`along_reference`), the pooled pass@1 gain
    at every point, and the groups with a non-zero gradient in each segment of the run."""
    along, base = summary["along"], summary["baseline"]
    name, steps = along["primary_name"], along["steps"]
    points = zip(steps, along["sampled_rollouts"], strict=True)
    heads = [f"step {s} ({r:,} rollouts)" for s, r in points]
    others = [arm for arm in along["arms"] if arm != base]
    lines = [
        "",
        f"The primary along the runs: relative {name} gain over `{base}` at each point, paired "
        f"by seed and problem, paired bootstrap {level} % intervals; the change from step "
        f"{steps[0]} to step {steps[-1]} with its paired interval, and its reading (grows / "
        "closes: the change's interval lies above / below 0; else holds):",
        "",
        "| arm | " + " | ".join(heads) + f" | change, step {steps[0]} to {steps[-1]} | reading |",
        "|---|" + "---|" * (len(steps) + 2),
    ]
    for arm in others:
        curve = along["arms"][arm]
        cells = [_interval(g) for g in curve["primary gain"]]
        cells += [_interval(curve["primary change"]), curve["reading"]]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    reference = summary.get("along_reference")
    if reference is not None:
        ref_heads = [
            f"step {s} ({r:,} rollouts)"
            for s, r in zip(reference["steps"], reference["sampled_rollouts"], strict=True)
        ]
        lines += [
            "",
            f"The same gain along the runs of the study this one continues ({reference['results']}"
            "; other runs of the same arms, seeds and warm start):",
            "",
            "| arm | " + " | ".join(ref_heads) + " |",
            "|---|" + "---|" * len(ref_heads),
        ]
        for arm in others:
            if arm in reference["arms"]:
                cells = [_interval(g) for g in reference["arms"][arm]["primary gain"]]
                lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Pooled pass@1 gain over `{base}` at each point (paired {level} % intervals):",
        "",
        "| arm | " + " | ".join(heads) + " |",
        "|---|" + "---|" * len(steps),
    ]
    for arm in others:
        cells = [_interval(g) for g in along["arms"][arm]["pooled pass@1 gain"]]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    segments = [f"steps {a + 1}-{b}" for a, b in zip((0, *steps[:-1]), steps, strict=True)]
    lines += [
        "",
        "Groups with a non-zero gradient, mean over each segment's steps and the seeds:",
        "",
        "| arm | " + " | ".join(segments) + " |",
        "|---|" + "---|" * len(steps),
    ]
    for arm, curve in along["arms"].items():
        cells = ["n/a" if v is None else f"{v:.3f}" for v in curve["nonzero_gradient_fraction"]]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines
