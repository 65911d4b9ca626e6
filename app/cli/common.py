"""What every ``paraplan`` command shares: the consoles, the exit codes, the one-line input error, JSON
output and ``--fix KEY=VALUE`` parsing. Commands import this module; it imports no command, so the command
modules and ``app.cli.main`` never import each other back."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console

from app.formats.inputs import InputError

from .console import stdout_console

EXIT_INPUT = 2
EXIT_NO_FIT = 3
out = stdout_console()
err = Console(stderr=True, soft_wrap=True)


def fail(exc: InputError) -> None:
    """Bad input: ``error: <field>: <reason>`` on stderr and exit 2 (never a traceback)."""
    err.print(f"[red]error:[/red] {exc}", highlight=False)
    sys.exit(EXIT_INPUT)


def print_json(data) -> None:
    """A command's result as indented JSON on stdout (NaN and infinity refused: they are not JSON)."""
    click.echo(json.dumps(data, indent=2, allow_nan=False))


def parse_fix(items: tuple[str, ...]) -> dict:
    """``--fix KEY=VALUE`` options as a dict; a value is JSON where it parses, else the bare string (such as
    ``recompute=selective``)."""
    fixed = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise InputError("fix", f"{item!r} is not KEY=VALUE")
        try:
            fixed[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            fixed[key.strip()] = raw
    return fixed
