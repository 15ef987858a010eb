"""Optional pieces of murmur, installed as extras: the commands that need one ask for it by name."""

from __future__ import annotations

import importlib.util

__all__ = ["MissingExtra", "require"]


class MissingExtra(ValueError):
    """A module that an extra of murmur installs is not there."""


def require(module: str, extra: str, what: str) -> None:
    """Raise :class:`MissingExtra`, saying what to install, unless ``module`` can be imported
    (looked up, not imported: scikit-learn's import alone costs seconds).

    Args:
        module: the top-level module, ``sklearn``.
        extra: the extra of murmur that installs it, ``digits``.
        what: what needs it, for the message: ``the digits task``.
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except ValueError:  # in sys.modules as None: imports of it fail
        found = False
    if not found:
        raise MissingExtra(
            f"{what} needs {module}, which is not installed: pip install 'murmur[{extra}]'"
        )
