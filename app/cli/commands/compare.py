"""``paraplan compare A B``: two configs evaluated side by side, every time and memory part, the differences
and their causes in the cost model's terms (``app.formats.compare``), ordered by size.

A and B are each a search result's ranked config (``results.json#3``), a config file (with ``--model``), or a
launch script (``paraplan import``'s input). The model, cluster and devices come from a result or a script,
or from ``--model``, ``--cluster`` and ``--devices``. ``--json`` prints the comparison's JSON. Bad input:
``error: <field>: <reason>`` on stderr and exit 2.
"""

from __future__ import annotations


import click
from rich.table import Table

from app.formats.compare import compare, load_side, side
from app.formats.inputs import InputError, check_devices, load_cluster
from search.frameworks import FRAMEWORKS

from ..common import fail, print_json
from ..console import stdout_console



def _f(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def print_comparison(cmp: dict, out=None) -> None:
    """The comparison as tables: headline, every part with A, B and B − A, then the causes by size."""
    out = out or stdout_console()
    a, b = cmp["a"]["label"], cmp["b"]["label"]
    h = cmp["headline"]
    t = Table(title=f"A = {a}   B = {b}", title_justify="left")
    for col in ("", "A", "B", "B − A"):
        t.add_column(col, justify="left" if not col else "right")
    for key, spec in (("step_time_s", ".3f"), ("tokens_per_s_per_device", ",.1f"), ("mfu", ".3f"), ("peak_gib", ".1f")):
        x, y = h[key]["a"], h[key]["b"]
        t.add_row(key.removesuffix("_s").removesuffix("_gib").replace("_", " "), _f(x, spec), _f(y, spec),
                  _f(None if x is None or y is None else y - x, "+" + spec))
    for row in cmp["parts"]:
        unit = "s" if row["kind"] == "time" else "GiB"
        t.add_row(f"{row['kind']} {row['part'].removesuffix('_s').removesuffix('_gib')} ({unit})",
                  _f(row["a"], ".3f"), _f(row["b"], ".3f"), _f(row["delta"], "+.3f"))
    out.print(t)
    if cmp["gain"] is not None:
        out.print(f"B over A: {cmp['gain']:+.1%} tokens/s per device", highlight=False)
    if cmp["differences"]:
        out.print("why they differ (by size):", highlight=False)
        for d in cmp["differences"]:
            out.print(f"  {d['text']}", highlight=False, soft_wrap=True, markup=False)


@click.command("compare")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--cluster", default=None, help="Profile name or file (default: a result's cluster).")
@click.option("--model", default=None, help="Preset or spec file, for a config file side.")
@click.option("--devices", type=int, default=None, help="Devices (default: a result's or a script's).")
@click.option("--framework", type=click.Choice(FRAMEWORKS), default=None, help="A script side's framework.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare_cmd(a, b, cluster, model, devices, framework, as_json) -> None:
    """Compare two configs part by part and say why they differ (A: results.json#3, a config, or a script)."""
    try:
        la = load_side(a, cluster, model, devices, framework, "A")
        lb = load_side(b, cluster or la[4], model, devices or la[3], framework, "B")
        la = load_side(a, cluster or lb[4], model, devices or lb[3], framework, "A") if la[4] is None or la[3] is None else la
        sides = []
        for (label, spec, cfg, n, cl), name in ((la, "A"), (lb, "B")):
            if cl is None:
                raise InputError("cluster", "give --cluster (no result names one)")
            if n is None:
                raise InputError("devices", f"{name} does not state its devices: give --devices")
            check_devices(n)
            sides.append(side(label, spec, cfg, n, load_cluster(cl)))
    except InputError as exc:
        fail(exc)
    cmp = compare(*sides)
    if as_json:
        print_json(cmp)
    else:
        print_comparison(cmp)
