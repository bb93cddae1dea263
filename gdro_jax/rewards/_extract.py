"""Final-answer extraction from a completion: the last `\\boxed{}`, else an "Answer:" line.

`extract_answer` returns the content of the last `\\boxed{...}` or `\\fbox{...}` whose braces
balance (nested braces count; escaped `\\{`/`\\}` do not), or of the shorthand `\\boxed 5`. A
`\\boxed` left unclosed (a completion cut off mid-answer) or left empty (an echo of the
instruction's `\\boxed{}`) is passed over in favour of an earlier one. Without any boxed answer,
the fallback patterns are tried (default: the last line starting with "Answer:" or "Final
answer:"); `fallback_patterns=()` turns them off.

The scan is linear in the completion's length (one pass over the braces from the first
`\\boxed`), so a megabyte of text or a pile of unclosed braces costs milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_BOX_START = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# A backslash with the character after it is one token (`\{`, `\}`, `\\`), so escaped braces and
# LaTeX line breaks never count as grouping braces.
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)
# `\boxed 5`: one run of characters up to a space, `$` or an unescaped brace.
_SHORTHAND = re.compile(r"[ \t]+((?:\\.|[^\s{}$\\])+)")

ANSWER_LINE_PATTERNS: tuple[re.Pattern, ...] = (
    re.compile(
        r"^[ \t*#>_-]*(?:final[ \t]+)?answer[ \t*_]*[:：][ \t*_]*(?P<answer>\S.*?)[ \t*_]*$",
        re.IGNORECASE | re.MULTILINE,
    ),
)


def _matching_braces(text: str, start: int) -> dict[int, int]:
    """Position of each `{` at or after `start` -> position of its matching `}` (when closed)."""
    stack: list[int] = []
    match: dict[int, int] = {}
    for token in _BRACE_TOKEN.finditer(text, start):
        char = token.group()
        if char == "{":
            stack.append(token.start())
        elif char == "}" and stack:
            match[stack.pop()] = token.start()
    return match


def _boxed_answer(text: str) -> str | None:
    starts = [found.end() for found in _BOX_START.finditer(text)]
    if not starts:
        return None
    match = _matching_braces(text, starts[0])
    for end_of_command in reversed(starts):
        position = end_of_command
        while position < len(text) and text[position] in " \t\n":
            position += 1
        if position < len(text) and text[position] == "{":
            close = match.get(position)
            content = text[position + 1 : close].strip() if close is not None else ""
        else:
            shorthand = _SHORTHAND.match(text, end_of_command)
            content = shorthand.group(1) if shorthand else ""
        if content:
            return content
    return None


def _clean_line_answer(answer: str) -> str:
    """Strips math delimiters and a final full stop from an "Answer:" line."""
    answer = answer.strip().rstrip(".").strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if answer.startswith(left) and answer.endswith(right) and len(answer) > len(left + right):
            answer = answer[len(left) : -len(right)].strip()
            break
    return answer.rstrip(".").strip()


def extract_answer(
    text: str, *, fallback_patterns: Sequence[re.Pattern] = ANSWER_LINE_PATTERNS
) -> str | None:
    """The final answer written in a completion, or None when it states none.

    Args:
      text: the completion.
      fallback_patterns: regular expressions with a group named `answer`, tried (last match
        wins, first pattern first) only when the text has no usable `\\boxed{}`/`\\fbox{}`;
        `()` disables the fallback.

    Returns:
      The answer text without its box (e.g. `"\\frac{1}{2}"`), stripped, or None.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    boxed = _boxed_answer(text)
    if boxed is not None:
        return boxed
    for pattern in fallback_patterns:
        matches = list(pattern.finditer(text))
        if matches:
            answer = _clean_line_answer(matches[-1].group("answer"))
            if answer:
                return answer
    return None
