"""``--from-launch FILE`` on ``paraplan evaluate`` and ``paraplan search``: the model, config, devices and
framework read from the team's launch script (``paraplan import``) instead of ``--model``/``--config``/
``--devices``/``--global-batch-size``.

``evaluate --from-launch train.sh --cluster C`` scores the script's config. ``search --from-launch train.sh
--cluster C`` searches the script's model at its global batch and devices (the framework's too, unless
``--framework`` is given), prints the ranking, then the team's own config scored beside the best and the
comparison of the two (``paraplan compare``), so "should we change anything?" is one command; with
``--json`` the result gains ``from_launch`` (the import, the team's evaluation, the gain and the comparison).
Options given on the command line win over the script's.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

import click

from app.formats.inputs import InputError

from app.formats.launch_import import imported_json

from ..common import fail, print_json
from .launch_import import print_notes


def add_from_launch(command: click.Command, kind: str) -> click.Command:
    """``command`` (``evaluate`` or ``search``) with ``--from-launch``; the options the script supplies
    stop being required."""
    supplied = {"model", "devices", "config", "global_batch_size"}
    for p in command.params:
        if p.name in supplied:
            p.required = False
    command.params.append(click.Option(["--from-launch", "from_launch"], default=None, metavar="FILE|-",
                                       help="Read the model, config, devices and global batch from a Megatron-LM "
                                            "or MindSpeed-LLM launch script (`paraplan import`)."))
    original = command.callback

    def callback(from_launch=None, **kw):
        if from_launch is None:
            missing = [n for n in supplied if n in kw and kw[n] is None]
            if missing:
                flag = "--" + sorted(missing)[0].replace("_", "-")
                fail(InputError(sorted(missing)[0], f"missing: give {flag} or --from-launch FILE"))
            return original(**kw)
        imp = _read(from_launch, kw.get("framework"))
        kw["model"] = kw["model"] or json.dumps(imp.spec.model_dump(mode="json", exclude_none=True))
        kw["devices"] = kw["devices"] or imp.devices
        if kw["devices"] is None:
            fail(InputError("devices", "the script's launcher does not state nodes × processes: give --devices"))
        if kind == "evaluate":
            kw["config"] = kw["config"] or json.dumps(imp.config.model_dump(mode="json", exclude_defaults=True))
            print_notes(imp)
            return original(**kw)
        kw["global_batch_size"] = kw["global_batch_size"] or imp.config.global_batch_size
        kw["framework"] = kw.get("framework") or imp.framework
        if imp.config.precision == "fp8" and kw.get("precision") == "bf16":
            kw["precision"] = "fp8"  # the script's precision, as its model and batch (bf16 is the option's default)
        print_notes(imp)
        return _search_beside(original, kw, imp)

    command.callback = callback
    return command


def _read(path: str, framework: str | None):
    from app.formats.launch_import import read_launch_file

    try:
        return read_launch_file(path, framework)
    except InputError as exc:
        fail(exc)


def _search_beside(search, kw: dict, imp) -> None:
    """Run the search (as JSON, captured), then print the ranking and the team's config beside the best."""
    from app.formats.compare import compare, side
    from app.formats.inputs import load_cluster, load_config, load_model

    buf = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(buf):
        try:
            search(**{**kw, "as_json": True})
        except SystemExit as exc:  # no config fits (3): the team's config is still reported
            code = exc.code or 0
            if code not in (0, 3):
                sys.stdout.write(buf.getvalue())
                raise
    result = json.loads(buf.getvalue())
    spec = load_model(kw["model"], kw.get("seq_length"))
    profile = load_cluster(kw["cluster"])
    config = imp.config.model_copy(update={"global_batch_size": kw["global_batch_size"]})
    if kw.get("moe_load_imbalance") is not None:
        config = config.model_copy(update={"moe_load_imbalance": kw["moe_load_imbalance"]})
    team = side("your launch", spec, config, kw["devices"], profile)
    best = result.get("best")
    cmp = compare(team, side("search best", spec, load_config(best["config"]), kw["devices"], profile)) if best else None
    if kw.get("as_json"):
        result["from_launch"] = {"import": imported_json(imp), "evaluation": team.evaluation,
                                 "gain": cmp["gain"] if cmp else None, "comparison": cmp}
        print_json(result)
    else:
        _print_beside(result, team, cmp)
    if code:
        sys.exit(code)


def _print_beside(result: dict, team, cmp: dict | None) -> None:
    """The ranking (the top layouts), the team's config scored, the best's gain and the comparison."""
    from rich.table import Table

    from app.formats.describe import config_brief

    from ..console import stdout_console
    from .compare import print_comparison

    out = stdout_console()
    t = Table(title=f"top {len(result['layouts'])} layouts ({result['trials']:,} scored, engine {result['engine']})",
              title_justify="left")
    for col in ("rank", "layout", "tokens/s/dev", "MFU", "peak GiB"):
        t.add_column(col, justify="left" if col == "layout" else "right", overflow="fold")
    for lay in result["layouts"]:
        ev = lay["evaluation"]
        t.add_row(str(lay["best_rank"]), config_brief(lay["config"]), f"{ev['tokens_per_s_per_device']:,.1f}",
                  f"{ev['mfu']:.3f}", f"{ev['memory']['peak_gib']:.1f}")
    out.print(t)
    ev = team.evaluation
    state = "fits" if ev["feasible"] else "does not fit: " + "; ".join(r["message"] for r in ev["infeasible_reasons"])
    tps = ev.get("tokens_per_s_per_device")
    out.print(f"your launch ({config_brief(team.config.model_dump(exclude_defaults=True))}): "
              + (f"{tps:,.1f} tokens/s/device, MFU {ev['mfu']:.3f}, " if tps is not None else "") + state,
              highlight=False)
    if cmp is None:
        return
    if cmp["gain"] is not None:
        out.print(f"the search's best: {cmp['gain']:+.1%} tokens/s per device over your launch", highlight=False)
    print_comparison(cmp, out)
