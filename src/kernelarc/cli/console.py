"""The rich Consoles the commands print with.

On a terminal, text wraps at the terminal's width. When the stream is piped or redirected,
a line is never cut or hard-wrapped at 80 columns (rich's default without a terminal): text is
soft-wrapped and tables get room to lay out at their natural width.
"""

from __future__ import annotations

import sys

from rich.console import Console

PIPED_WIDTH = 1000
"""The width tables may take when the stream is not a terminal."""


def console(*, stderr: bool = False) -> Console:
    """A Console on stdout (or stderr) that does not truncate lines when piped."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr, soft_wrap=True)
    return Console(stderr=stderr, soft_wrap=True, width=PIPED_WIDTH)
