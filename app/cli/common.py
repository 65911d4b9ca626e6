"""What every ``paraplan`` command shares: the consoles, the exit codes, the one-line input error, JSON
output and ``--fix KEY=VALUE`` parsing. Commands import this module; it imports no command, so the command
modules and ``app.cli.main`` never import each other back."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.markup import escape

from app.formats.inputs import InputError

from .console import stdout_console

EXIT_INPUT = 2
EXIT_NO_FIT = 3
out = stdout_console()
err = Console(stderr=True, soft_wrap=True)


def fail(exc: InputError) -> None:
    """Bad input: ``error: <field>: <reason>`` on stderr and exit 2 (never a traceback). The text is escaped:
    a field or flag in brackets (``runs[3]``, ``[layernorm]``) is shown, not read as console markup."""
    err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
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


def given(name: str) -> bool:
    """Whether the running command's parameter ``name`` was given on the command line (not its default,
    not an environment variable)."""
    ctx = click.get_current_context()
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


def unused_option(names: tuple[str, ...], why: str) -> InputError | None:
    """An option given on the command line that has no effect in this invocation, as the input error that
    names it (``--timeout: has no effect without --wait ...``); None when none of ``names`` was given.
    Options that do nothing are refused rather than ignored: the user meant something by them."""
    ctx = click.get_current_context()
    for name in names:
        if given(name):
            param = next(p for p in ctx.command.params if p.name == name)
            return InputError(max(param.opts, key=len), f"has no effect {why}")
    return None


JOBS_HELP = ("Processes to search with (an integer ≥ 1; default 1, in this process): the exhaustive engine scores "
             "parts of the space, the planners run their searches side by side, with the same result as one process. "
             "More than the machine's cores is allowed (with a note): the processes then share them "
             "(docs/concepts/parallel.md).")


def jobs_option(f):
    """``--jobs N``: the processes a search or a planner uses (``search.pool``)."""
    return click.option("--jobs", type=int, default=1, show_default=True, metavar="N", help=JOBS_HELP)(f)


def check_jobs(jobs: int) -> int:
    """``--jobs`` checked: an integer ≥ 1 (else the input error naming ``--jobs``); above the cores this
    process may run on, a note on stderr (allowed: a container may see fewer cores than it is given)."""
    from search.pool import usable_cores, validate_jobs

    try:
        validate_jobs(jobs)
    except ValueError as exc:
        raise InputError("--jobs", str(exc)) from None
    if jobs > (cores := usable_cores()):
        err.print(f"note: --jobs {jobs} is more than the {cores} cores this process may use: the processes will "
                  "share them", highlight=False)
    return jobs
