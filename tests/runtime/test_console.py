"""The stream `logging_above_bars` puts into the console's log handlers is a full text stream.

vLLM's start-up calls `logging.config.dictConfig`, which closes every existing handler; absl's
handler then closes its stream unless it is `sys.stderr`/`sys.stdout` or a terminal. The
wrapper must take that close (an `AttributeError` before), leave the process's stream open, keep
passing later records through, and answer `isatty`, `fileno` and `encoding` as the stream it
wraps does (the reference here: that stream itself). Planted: `close` removed (the
`AttributeError` of issue 38), `close` closing the wrapped stream, `isatty` always False.
"""

import io
import logging
import os
import sys
import weakref

import pytest
from absl import logging as absl_logging

from gdro_jax.runtime import logging_above_bars


def _wrapped_stream(handler):
    return getattr(handler, "python_handler", handler).stream


@pytest.fixture
def absl_handler_on(monkeypatch):
    """Installs an absl handler writing to a given stream as `sys.stderr`, on the root logger."""
    installed = []

    def install(stream):
        monkeypatch.setattr(sys, "stderr", stream)
        handler = absl_logging.ABSLHandler(absl_logging.PythonFormatter())
        handler.activate_python_handler()
        handler.python_handler.stream = stream
        logging.getLogger().addHandler(handler)
        installed.append(handler)
        return handler

    yield install
    for handler in installed:
        logging.getLogger().removeHandler(handler)


def test_shutting_down_the_handlers_leaves_the_stream_open_and_writing(tmp_path, absl_handler_on):
    with open(tmp_path / "console.txt", "w", encoding="utf-8") as console:  # not a terminal
        handler = absl_handler_on(console)
        with logging_above_bars():
            wrapper = _wrapped_stream(handler)
            assert wrapper is not console
            # What `logging.config.dictConfig` does to each existing handler (flush, close),
            # on this handler alone so the test leaves pytest's own handlers open.
            logging.shutdown([weakref.ref(handler)])
            assert not console.closed and not wrapper.closed
            logging.getLogger("after").warning("still shown after the close")
        assert _wrapped_stream(handler) is console  # restored on leaving the block
    shown = (tmp_path / "console.txt").read_text(encoding="utf-8")
    assert "still shown after the close" in shown


def test_the_wrapper_answers_as_the_stream_it_wraps(tmp_path, absl_handler_on):
    leader, follower = os.openpty()
    terminal = os.fdopen(follower, "w", encoding="utf-8")
    try:
        with open(tmp_path / "console.txt", "w", encoding="latin-1") as file:
            for stream in (terminal, file):
                handler = absl_handler_on(stream)
                with logging_above_bars():
                    wrapper = _wrapped_stream(handler)
                    assert wrapper.isatty() == stream.isatty()
                    assert wrapper.fileno() == stream.fileno()
                    assert wrapper.encoding == stream.encoding
                    assert wrapper.writable() and not wrapper.readable()
                    wrapper.writelines(["one\n", "two\n"])
                    wrapper.flush()
                logging.getLogger().removeHandler(handler)
            assert terminal.isatty() and not file.isatty()  # both kinds were seen
        lines = (tmp_path / "console.txt").read_text(encoding="latin-1").splitlines()
        assert lines == ["one", "two"]
    finally:
        terminal.close()
        os.close(leader)


def test_a_stream_without_a_file_descriptor_says_so(absl_handler_on):
    handler = absl_handler_on(io.StringIO())
    with logging_above_bars():
        with pytest.raises(io.UnsupportedOperation):
            _wrapped_stream(handler).fileno()
