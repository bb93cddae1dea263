"""What a person reads around a progress bar: notices and log records printed above the bar,
never glued to it.

tqdm redraws its bar in place with carriage returns; anything else written to the terminal while
a bar is shown lands after the bar's text, on its line. `notice` writes a line through
`tqdm.write`, which clears the bar, prints the line and redraws the bar below it;
`logging_above_bars` sends the console's log records (absl's handler included) the same way while
bars are shown.
"""

from __future__ import annotations

import contextlib
import logging
import sys

from tqdm.auto import tqdm


def notice(message: str) -> None:
    """Prints `message` on stderr above any progress bar (a line of its own)."""
    tqdm.write(message, file=sys.stderr)


class _AboveBars:
    """A text stream whose lines go through `tqdm.write` to the stream it replaces."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        for line in text.rstrip("\n").split("\n") if text.strip() else ():
            tqdm.write(line, file=self._stream)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


@contextlib.contextmanager
def logging_above_bars():
    """Within the block, log records the console shows (the root logger's stream handlers to
    stdout or stderr, absl's among them) print above progress bars."""
    swapped = []
    for handler in logging.getLogger().handlers:
        inner = getattr(handler, "python_handler", handler)  # absl's handler wraps a stream one
        if isinstance(inner, logging.StreamHandler) and inner.stream in (sys.stdout, sys.stderr):
            swapped.append((inner, inner.stream))
            inner.stream = _AboveBars(inner.stream)
    try:
        yield
    finally:
        for inner, stream in swapped:
            inner.stream = stream
