"""``paraplan report (RESULT.json | --server URL --job ID [--api-key KEY]) -o FILE.html``: the job report.

RESULT.json is what ``paraplan search --json`` printed; with ``--server`` the service renders the report
(``GET /v1/jobs/{id}/report``) and this command saves it. Bad input (an unreadable or malformed file, a
missing field, a job that is unknown or not finished) is a message naming the field and exit 2; a server
that cannot be reached or answers 5xx is exit 7 (as ``paraplan submit``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

EXIT_INPUT = 2
EXIT_SERVER = 7


def _fail(field: str, reason: str, code: int = EXIT_INPUT) -> None:
    click.echo(f"error: {field}: {reason}", err=True)
    sys.exit(code)


def _from_server(server: str, job: str, api_key: str | None) -> str:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(f"{server.rstrip('/')}/v1/jobs/{job}/report", headers=headers, timeout=120)
    except httpx.HTTPError as exc:
        _fail("server", f"cannot reach {server} ({exc})", EXIT_SERVER)
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail")
            if isinstance(detail, list) and detail:
                detail = detail[0].get("msg")
        except ValueError:
            detail = resp.text[:300]
        field = {404: "job", 409: "job", 401: "api_key"}.get(resp.status_code, "server")
        _fail(field, f"the server answered {resp.status_code}: {detail}",
              EXIT_SERVER if resp.status_code >= 500 else EXIT_INPUT)
    return resp.text


def _render(result) -> str:
    """The page for what the file holds: a plan (``paraplan plan --json``: ``points``), an RL plan (``paraplan
    rl --json``: ``colocated`` and ``disaggregated``) or a search result."""
    from app.formats.plan import is_plan
    from app.formats.plan_report import render_plan_report
    from app.formats.report import render_report
    from app.formats.rl import is_rl
    from app.formats.rl_report import render_rl_report

    if is_rl(result):
        return render_rl_report(result)
    return render_plan_report(result) if is_plan(result) else render_report(result)


@click.command()
@click.argument("result_file", metavar="RESULT.json", required=False)
@click.option("--server", envvar="PARAPLAN_SERVER", default=None, help="Base URL of a ParaPlan server.")
@click.option("--job", "job_id", default=None, help="Job id on --server.")
@click.option("--api-key", envvar="PARAPLAN_API_KEY", default=None, help="API key (default: $PARAPLAN_API_KEY).")
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="HTML file to write.")
def report(result_file, server, job_id, api_key, output) -> None:
    """Write the HTML report of a search (inputs, four plots, the top configs), of a capacity plan or of an RL
    plan (``paraplan rl --json``: each mode's step timeline and per-phase peak memory)."""
    if (result_file is None) == (job_id is None):
        _fail("RESULT.json", "give either RESULT.json or --server URL --job ID")
    if job_id is not None:
        if not server:
            _fail("server", "--job needs --server URL")
        page = _from_server(server, job_id, api_key)
    else:
        from ..common import unused_option

        if (exc := unused_option(("server", "api_key"), "with RESULT.json (they fetch a job's report)")) is not None:
            _fail(exc.field, exc.reason)
        from app.formats.report import ReportError

        try:
            result = json.loads(Path(result_file).read_text())
        except OSError as exc:
            _fail("RESULT.json", f"cannot read {result_file} ({exc.strerror or exc})")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            _fail("RESULT.json", f"{result_file} is not JSON ({exc})")
        try:
            page = _render(result)
        except ReportError as exc:
            _fail(exc.field, exc.reason)
    try:
        output.write_text(page, encoding="utf-8")
    except OSError as exc:
        _fail("output", f"cannot write {output} ({exc.strerror or exc})")
    click.echo(f"wrote {output} ({len(page.encode()) / 1e6:.1f} MB)", err=True)
