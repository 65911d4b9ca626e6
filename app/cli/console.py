"""The consoles the commands print their tables on.

A reader that closes stdout early (``paraplan evaluate ... | head -1``) is not an error: the command stops
writing and finishes as it would have (exit 0 for ``evaluate``), as ``cat`` and ``grep`` do. Rich's console
exits 1 on a closed pipe; click's own handling of ``click.echo`` exits 1 too (``app.cli`` handles that one).
"""

from __future__ import annotations

import os
import sys

from rich.console import Console


def drop_stdout() -> None:
    """Point stdout at /dev/null, so that later writes and the interpreter's final flush do not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


class StdoutConsole(Console):
    def on_broken_pipe(self) -> None:
        """Stop printing and let the command finish: its exit code stays what the command decides (0 for
        ``evaluate``; ``submit`` still exits 3 when no config fits)."""
        self.quiet = True
        drop_stdout()


def echo(text: str, nl: bool = True) -> None:
    """``click.echo`` to stdout that treats a closed pipe as above (the command goes on, printing nothing)."""
    import click

    try:
        click.echo(text, nl=nl)
    except BrokenPipeError:
        drop_stdout()


def stdout_console() -> Console:
    """Tables on stdout: the terminal's width on a terminal, wide (200 columns) when piped (CI logs)."""
    return StdoutConsole(soft_wrap=True, width=None if sys.stdout.isatty() else 200)


def wrappable(text: str) -> str:
    """Config text with break opportunities between its tokens (``selective(layernorm+moe)`` becomes
    ``selective (layernorm +moe)``), for cells that must wrap: a narrow column then wraps between words
    instead of folding ``layernorm`` into ``layern`` / ``orm``."""
    return text.replace("(", " (").replace("+", " +")


def longest_word(texts) -> int:
    """The widest whitespace-separated word of ``texts``: a column at least this wide never folds a word."""
    return max((len(w) for t in texts for line in str(t).splitlines() for w in line.split()), default=1)
