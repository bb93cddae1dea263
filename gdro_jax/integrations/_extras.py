"""What the adapters (`tunix`, `trl`, `verl`) share: the check of the trainer they were tested
against."""

from __future__ import annotations

import importlib.metadata
import warnings


def warn_if_untested(module: str, package: str, tested: str, what: str) -> None:
    """Warns (once, at import) when `package`'s installed version is not `tested`, the version
    `module`'s extra pins; `what` names the parts of that trainer the adapter relies on."""
    found = importlib.metadata.version(package)
    if found != tested:
        warnings.warn(
            f"{module} is tested with {package} {tested}; {found} is installed, whose {what} "
            "may differ",
            stacklevel=3,
        )
