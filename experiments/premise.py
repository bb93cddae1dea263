"""The adversaries' premise on one or more task profiles: criteria table, JSON and figure.

    python -m experiments.premise --profiles=cliff,graded \
        --warm_starts=runs/cliff/warm,runs/graded/warm \
        --pilots=runs/cliff/grpo,runs/graded/grpo --out=results/premise

Each profile: a warm-start folder (`experiments/pretrain.py`: its `frontier.json` holds the
validation evaluation) and a GRPO pilot's workdir (`experiments/train.py`: `metrics.jsonl`, and
`config.json`, whose task gives the pool's level shares). Prints the markdown table of
`study.premise_criteria` (the per-step criteria pooled and batch by batch) and writes
`OUT/criteria.json` (with the machine that computed it) and `OUT/premise.png`.
"""

import json
import pathlib

from absl import flags

from experiments import _cli
from gdro_jax import configs, study, train
from gdro_jax.runtime import environment

_PROFILES = flags.DEFINE_list("profiles", None, "Profile names, e.g. cliff,graded.")
_WARM = flags.DEFINE_list("warm_starts", None, "Each profile's warm-start folder.")
_PILOTS = flags.DEFINE_list("pilots", None, "Each profile's GRPO pilot workdir.")
_AFTER = flags.DEFINE_integer("after_step", 30, "Count pilot steps after this one.")
_OUT = flags.DEFINE_string("out", None, "Folder for criteria.json and premise.png.")


def main(argv):
    del argv
    if not len(_PROFILES.value) == len(_WARM.value) == len(_PILOTS.value):
        raise ValueError("give one --warm_starts and one --pilots folder per --profiles name")
    evidence, criteria = {}, {}
    for name, warm, pilot in zip(_PROFILES.value, _WARM.value, _PILOTS.value, strict=True):
        evaluation = json.loads((pathlib.Path(warm) / "frontier.json").read_text())["evaluation"]
        rows = train.read_metrics(pathlib.Path(pilot) / "metrics.jsonl")
        run = json.loads((pathlib.Path(pilot) / "config.json").read_text())
        shares = study.pool_level_shares(configs.chain_task_config(run))
        evidence[name] = (evaluation, rows)
        criteria[name] = study.premise_criteria(evaluation, rows, shares, after_step=_AFTER.value)
    print(study.format_criteria(criteria))
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    records = {name: [c._asdict() for c in cs] for name, cs in criteria.items()}
    record = {"profiles": records, "after_step": _AFTER.value, "environment": environment()}
    (out / "criteria.json").write_text(json.dumps(record, indent=2) + "\n")
    study.plot_premise(evidence, after_step=_AFTER.value).savefig(out / "premise.png", dpi=80)
    files = {"criteria.json": "each criterion's value and verdict", "premise.png": "the figure"}
    print(_cli.wrote(out, files))


if __name__ == "__main__":
    _cli.run(main, required=("profiles", "warm_starts", "pilots", "out"))
