"""``paraplan import FILE|-``: a Megatron-LM or MindSpeed-LLM launch script (or argument list) read into
ParaPlan's model spec and training config (``app.formats.launch_import``, the inverse of ``paraplan export``).

Prints the framework, the devices (nodes × processes per node when the launcher states them), the config and
the model, the notes on every flag ignored and the warnings on what the framework would refuse; ``--json``
the same as JSON. An unknown flag, a refused one, a flag without its value, contradictory flags or a script
it cannot read: ``error: launch.<flag>: <reason>`` on stderr and exit 2.
"""

from __future__ import annotations

import json

import click
from rich.markup import escape

from search.frameworks import FRAMEWORKS

from app.formats.inputs import InputError
from app.formats.launch_import import imported_json, read_launch_file

from ..common import err, fail, print_json


def print_notes(imp) -> None:
    """The import's notes and warnings on stderr (stdout stays the result)."""
    for n in imp.notes:
        err.print(f"note: {escape(n)}", highlight=False)
    for w in imp.warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)


@click.command("import")
@click.argument("launch_file", metavar="FILE|-")
@click.option("--framework", type=click.Choice(FRAMEWORKS), default=None,
              help="The script's framework (default: MindSpeed-LLM when it uses msrun or a flag only MindSpeed-LLM "
                   "has, else Megatron-LM).")
@click.option("--json", "as_json", is_flag=True, help="Print the import as JSON (model, config, devices, notes).")
def import_launch(launch_file, framework, as_json) -> None:
    """Read a launch script's training arguments into a model spec and a training config."""
    try:
        imp = read_launch_file(launch_file, framework)
    except InputError as exc:
        fail(exc)
    data = imported_json(imp)
    if as_json:
        print_json(data)
        print_notes(imp)
        return
    from app.formats.describe import config_brief

    click.echo(f"framework: {imp.framework}")
    click.echo(f"devices:   {imp.devices if imp.devices is not None else 'not stated (give --devices)'}")
    click.echo(f"layout:    {config_brief(data['config'])}")
    click.echo("config:    " + json.dumps(data["config"]))
    click.echo("model:     " + json.dumps(data["model"]))
    print_notes(imp)
