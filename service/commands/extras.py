"""What the ``plots`` extra adds to the command line, and what a command does without it.

``pip install -e .`` installs the service alone; matplotlib (figures) and tqdm (progress bars)
come with ``pip install 'edgecut[plots]'``. A command that draws asks for matplotlib before it
starts its work and, when it is missing, says in one line what to install; a progress bar is a
nicety, so without tqdm the command runs without one."""

from __future__ import annotations

import sys

PLOTS_INSTALL = "pip install 'edgecut[plots]'"


class MissingExtra(Exception):
    """A command needs a package of an extra that is not installed; the message says which."""


def require_plotting(what: str) -> None:
    """Checked before the work starts, so a long run never ends in an ImportError."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtra(f"{what} needs matplotlib: {PLOTS_INSTALL}") from None


def progress_bar(total: int, desc: str, enabled: bool = True):
    """A tqdm bar on stderr, or None when disabled or tqdm is not installed. tqdm hides itself
    when stderr is not a terminal, so pipes and CI logs stay clean."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None

    return tqdm(total=total, desc=desc, unit="run", disable=None, leave=False, file=sys.stderr)
