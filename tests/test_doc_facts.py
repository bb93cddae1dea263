"""Facts the docs list by hand agree with the code that defines them, so the next change to
either cannot leave the other stale: the fields a resumed run may change
(`configs.RESUMABLE_FIELDS`), the training methods (`controllers.METHODS`) and the evaluation's
weight dtypes (`eval.DTYPES`). Each list is read from its page between two phrases that
introduce and end it; a page that drops the phrase fails here too.
"""

import re
from pathlib import Path

from gdro_jax import configs, controllers, step
from gdro_jax import eval as evaluation

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _names_between(page: str, start: str, end: str) -> list[str]:
    """The backticked names in `page` between the first `start` and the next `end`, in order
    (`checkpoint.*` read as the block `checkpoint`)."""
    text = " ".join((DOCS / page).read_text().split())
    assert start in text, f"docs/{page} no longer says {start!r}"
    after = text.split(start, 1)[1]
    assert end in after, f"docs/{page}: {end!r} no longer ends the list"
    section = after.split(end, 1)[0]
    return [name.removesuffix(".*") for name in re.findall(r"`([\w.*]+)`", section)]


def test_the_fields_a_resume_may_change_are_the_codes():
    names = _names_between(
        "checkpoints.md", "Fields that may change on resume", "Both configs are completed"
    )
    names = [name for name in names if name != "configs.RESUMABLE_FIELDS"]
    assert sorted(names) == sorted(configs.RESUMABLE_FIELDS)


def test_the_methods_listed_are_the_records():
    names = _names_between("training.md", "is one of the records of", "Each step logs")
    listed = [name for name in names if name in controllers.METHODS or "_" in name]
    methods = [name for name in listed if not name.startswith(("filter/", "controllers."))]
    assert methods == list(controllers.METHODS)


def test_the_evaluation_dtypes_are_the_codes():
    text = " ".join((DOCS / "evaluation.md").read_text().split())
    match = re.search(r"`--dtype=auto` \(the default\)", text)
    assert match, "docs/evaluation.md no longer documents --dtype"
    for dtype in evaluation.DTYPES:
        assert dtype in text[match.start() : match.start() + 400], dtype


def test_the_step_phases_the_architecture_names_are_the_programs():
    text = (DOCS / "architecture.md").read_text()
    named = set(re.findall(r"`StepProgram\.(\w+)`", text))
    phases = {"init_state", "abstract_state", "plan", "rollout_function", "rescore", "update"}
    assert phases <= named, phases - named
    for name in named:
        assert hasattr(step.StepProgram, name), f"docs/architecture.md names StepProgram.{name}"


def test_the_protocols_the_architecture_names_are_the_decisions():
    names = _names_between("architecture.md", "(as optax has one", "maps the decisions")
    protocols = [
        name for name in names if name not in ("GradientTransformation", "controllers.PROTOCOLS")
    ]
    assert protocols == [protocol.__name__ for protocol in controllers.PROTOCOLS.values()]
    assert list(controllers.PROTOCOLS) == list(controllers.DECISIONS)


def test_the_run_level_arguments_the_architecture_names_are_the_codes():
    names = _names_between("architecture.md", "the run-level arguments it accepts", "2. Its line")
    assert sorted(names) == sorted(configs.RUN_LEVEL_ARGUMENTS)
