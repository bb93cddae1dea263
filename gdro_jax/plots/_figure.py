"""`figure(**kwargs)`: a matplotlib `Figure` (no pyplot, no global state), with matplotlib imported
on the first call rather than with the package, so commands that draw nothing start sooner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def figure(**kwargs: Any) -> Figure:
    """`matplotlib.figure.Figure(**kwargs)`; save it with `savefig`."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)
