"""Tests of answer extraction (last balanced `\\boxed{}`, fallbacks, a property test against a
plain reference scanner) and of in-process grading on answers math-verify must read alike."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdro_jax import rewards


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so $\\boxed{42}$.", "42"),
        ("first \\boxed{1}, then \\boxed{2}", "2"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
        ("\\fbox{7} is it", "7"),
        ("\\boxed {x+1}", "x+1"),
        ("\\boxed 5 and done", "5"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{a \\\\ b}", "a \\\\ b"),
        ("\\boxed{3} ... the answer is \\boxed{4", "3"),  # last one cut off
        ("\\boxed{5} put it in \\boxed{} please", "5"),  # last one empty
        ("\\boxed{\\boxed{6}}", "6"),
        ("\\boxedx{3}\nAnswer: 8", "8"),  # \boxedx is another command
        ("no answer here", None),
        ("\\boxed{1", None),
        ("", None),
    ],
)
def test_extract_boxed(text, expected):
    assert rewards.extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("work...\nAnswer: 12", "12"),
        ("Answer: 1\nmore work\n**Final Answer:** $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("answer：7", "7"),
        ("The answer is 12", None),
        ("Answer:   \n", None),
    ],
)
def test_extract_answer_line_fallback(text, expected):
    assert rewards.extract_answer(text) == expected


def test_fallback_can_be_disabled_and_replaced():
    import re

    assert rewards.extract_answer("Answer: 12", fallback_patterns=()) is None
    pattern = re.compile(r"the answer is (?P<answer>\S+)")
    assert rewards.extract_answer("the answer is 9", fallback_patterns=[pattern]) == "9"


def test_extract_rejects_non_strings():
    with pytest.raises(TypeError, match="text must be a string"):
        rewards.extract_answer(None)


# ---- property test against a plain reference ------------------------------------------------

TOKENS = ["{", "}", "a", "1", " ", "\\{", "\\}", "\\boxed", "\\fbox", "\\frac"]


def reference_extract(tokens):
    """Last \\boxed/\\fbox whose braces close (forward scan per candidate, O(n^2)), else None."""
    for start in reversed(range(len(tokens))):
        if tokens[start] not in ("\\boxed", "\\fbox"):
            continue
        position = start + 1
        while position < len(tokens) and tokens[position] == " ":
            position += 1
        if position >= len(tokens):
            continue
        if tokens[position] != "{":
            # Shorthand `\boxed 5`: one space-separated run of non-brace tokens.
            if position == start + 1:
                continue
            run = []
            for token in tokens[position:]:
                if token in ("{", "}", " "):
                    break
                run.append(token)
            if run:
                return "".join(run)
            continue
        depth = 0
        for end in range(position, len(tokens)):
            depth += {"{": 1, "}": -1}.get(tokens[end], 0)
            if depth == 0:
                content = "".join(tokens[position + 1 : end]).strip()
                if content:
                    return content
                break
    return None


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=40))
def test_extract_matches_reference(tokens):
    assert rewards.extract_answer("".join(tokens), fallback_patterns=()) == reference_extract(
        tokens
    )


# ---- in-process grading -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "gold, prediction",
    [
        ("\\dfrac{1}{9}", "1/9"),
        ("100\\text{ square units}", "100"),
        ("10^\\circ", "10"),
        ("\\$6", "6"),
        ("10{,}000", "10000"),
        ("025", "25"),
        ("4.5e33", "4.5\\times 10^{33}"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    ],
)
def test_equivalent_answers_grade_correct(gold, prediction):
    grade = rewards.grade_completion(f"so \\boxed{{{prediction}}}", gold)
    assert grade == rewards.Grade(1.0, rewards.CORRECT)


@pytest.mark.parametrize(
    "gold, prediction", [("\\frac{1}{9}", "1/8"), ("10", "100"), ("4.5e33", "4.5e32"), ("x", "y")]
)
def test_different_answers_grade_wrong(gold, prediction):
    grade = rewards.grade_completion(f"so \\boxed{{{prediction}}}", gold)
    assert grade == rewards.Grade(0.0, rewards.WRONG)


def test_no_answer_grades_no_answer():
    assert rewards.grade_completion("I give up.", "3") == rewards.Grade(0.0, rewards.NO_ANSWER)


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("4.5e33", "4.5\\times10^{33}"),
        ("1E-3", "1\\times10^{-3}"),
        ("e^{2}", "e^{2}"),
        ("2e", "2e"),
        ("x1e5", "x1e5"),
    ],
)
def test_normalize_answer_rewrites_only_scientific_notation(answer, expected):
    assert rewards.normalize_answer(answer) == expected
