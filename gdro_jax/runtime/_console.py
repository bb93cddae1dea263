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
import io
import logging
import sys

from tqdm.auto import tqdm

# On a progress bar until its first step is done: that step compiles (or loads from jax's
# persistent compilation cache) the whole step, the longest wait of a short run.
COMPILING_NOTE = "compiling (first step)..."


def notice(message: str) -> None:
    """Prints `message` on stderr above any progress bar (a line of its own)."""
    tqdm.write(message, file=sys.stderr)


class _AboveBars(io.TextIOBase):
    """A text stream whose lines go through `tqdm.write` to the stream it replaces.

    It stands in for the process's stdout or stderr inside a logging handler, so it answers what
    a handler or a library asks of a text stream as that stream does (`isatty`, `fileno`,
    `encoding`, `writable`). Closing it flushes and closes nothing: the stream belongs to the
    process. `logging.config.dictConfig` (vLLM calls it at start-up) closes every handler, and
    absl's closes its stream unless that is `sys.stderr`/`sys.stdout` or a terminal; the handler
    stays on the root logger and keeps writing to this wrapper afterwards.
    """

    def __init__(self, stream):
        super().__init__()
        self._stream = stream

    def write(self, text: str) -> int:
        for line in text.rstrip("\n").split("\n") if text.strip() else ():
            tqdm.write(line, file=self._stream)
        return len(text)

    def flush(self) -> None:
        if not self._stream.closed:
            self._stream.flush()

    def close(self) -> None:
        self.flush()

    @property
    def closed(self) -> bool:
        return self._stream.closed

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()  # io.UnsupportedOperation where the stream has none

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str | None:
        return getattr(self._stream, "encoding", None)

    @property
    def errors(self) -> str | None:
        return getattr(self._stream, "errors", None)


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
