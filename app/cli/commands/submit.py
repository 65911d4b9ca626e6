"""``paraplan submit``: the CI client. Submits a search job to a ParaPlan server, follows it with
``--wait``, prints the ranked configs, and says through its exit code whether the plan is usable.

Exit codes (docs/guides/service.md): 0 the job succeeded with a feasible config (and MFU ≥ ``--min-mfu``),
or was submitted (without ``--wait``); 2 bad input (here or as the server answered: 4xx); 3 no config
fits; 4 the job failed or was cancelled; 5 the best MFU is below ``--min-mfu``; 6 ``--timeout``
passed while waiting (the job goes on); 7 the server could not be reached or answered 5xx/429.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

import click

from ..resilience_flags import resilience_flags, resilience_from_flags

EXIT_OK, EXIT_INPUT, EXIT_NO_FIT, EXIT_FAILED, EXIT_MIN_MFU, EXIT_TIMEOUT, EXIT_SERVER = 0, 2, 3, 4, 5, 6, 7
ENGINES = ("auto", "exhaustive", "tpe", "nsga2", "random")
FINISHED = ("succeeded", "failed", "cancelled")


class ClientError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _input(value: str, field: str):
    """A preset/profile name as is; a JSON/YAML file or inline JSON object is read here and sent."""
    from app.formats.inputs import InputError, read_mapping

    if value.lstrip().startswith("{") or os.path.isfile(value):
        try:
            return read_mapping(value, field)
        except InputError as exc:
            raise ClientError(EXIT_INPUT, str(exc)) from None
    return value


def _fixed(items: tuple[str, ...]) -> dict:
    fixed = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ClientError(EXIT_INPUT, f"fix: {item!r} is not KEY=VALUE")
        try:
            fixed[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            fixed[key.strip()] = raw
    return fixed


def _problem(resp) -> str:
    try:
        detail = resp.json().get("detail")
    except ValueError:
        return resp.text[:500] or resp.reason_phrase
    if isinstance(detail, list):
        parts = []
        for d in detail:
            loc = [str(x) for x in d.get("loc", []) if x not in ("body", "path", "query", "header")]
            parts.append(f"{'.'.join(loc) or 'request'}: {d.get('msg')}")
        return "; ".join(parts)
    return str(detail)


def _check(resp):
    if resp.status_code < 400:
        return resp
    code = EXIT_SERVER if resp.status_code >= 500 or resp.status_code == 429 else EXIT_INPUT
    raise ClientError(code, f"the server answered {resp.status_code}: {_problem(resp)}")


def _brief(cfg: dict) -> str:
    """A config in one line, as the search table and the report name it (``app/formats/describe.py``)."""
    from app.formats.describe import config_brief

    return config_brief(cfg)


def _fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _print_table(job: dict, configs: list[dict]) -> None:
    from rich.table import Table

    from app.cli.console import longest_word, stdout_console, wrappable
    from app.formats.describe import distinct_briefs, margin_mark

    out = stdout_console()
    s = job.get("summary") or {}
    out.print(f"job {job['id']} [b]{job['status']}[/b] · engine {s.get('engine', '?')} · "
              f"{s.get('trials', 0):,} {_unit(job)} scored · {s.get('feasible_trials', 0):,} feasible · "
              f"{s.get('search_time_s', 0):.1f} s", highlight=False, soft_wrap=False)
    # On a narrow terminal (80 columns) the config column wraps between words (never inside one, app/cli/console.py);
    # the number columns keep exactly their widest cell.
    rows = []
    for e, brief in zip(configs, distinct_briefs([e["config"] for e in configs])):
        ev = e["evaluation"]
        rows.append([str(e["rank"]), brief, _fmt(ev["tokens_per_s_per_device"], ",.1f"),
                     _fmt(ev["mfu"], ".3f"), _fmt(ev["step_time_s"], ".2f"), _fmt(ev["memory"]["peak_gib"], ".1f"),
                     margin_mark(e)])
    def table(rows: list[list[str]]) -> Table:
        t = Table(title=f"top {len(configs)}", title_justify="left")
        for i, (col, just) in enumerate((("rank", "right"), ("config", "left"), ("tokens/s/dev", "right"),
                                         ("MFU", "right"), ("step s", "right"), ("peak GiB", "right"),
                                         ("margin", "left"))):
            width = longest_word([col] + [r[i] for r in rows])
            t.add_column(col, justify=just, **({"min_width": width} if col == "config" else {"width": width}))
        for r in rows:
            t.add_row(*r)
        return t

    t = table(rows)
    if out.measure(t, options=out.options.update_width(10_000)).maximum > out.width:
        t = table([[r[0], wrappable(r[1]), *r[2:]] for r in rows])
    out.print(t, soft_wrap=False)
    margin = (job["inputs"].get("search") or {}).get("memory_margin_gib")
    if any(e.get("keeps_margin") is False for e in configs):
        out.print(f"SHORT: headroom below the {margin:g} GiB memory margin: ranked after every config that keeps "
                  "it, and may not fit in practice.", highlight=False, soft_wrap=False)
    if job.get("best"):
        out.print("best config: " + json.dumps(job["best"]["config"], separators=(",", ":")), highlight=False,
                  soft_wrap=True)


def _unit(job: dict) -> str:
    """What the progress counts: configs for an exhaustive search (it scores the whole space), else trials."""
    return "configs" if ((job.get("inputs") or {}).get("search") or {}).get("engine") == "exhaustive" else "trials"


def _trials_note(job: dict, trials: int | None) -> str | None:
    """Why ``--trials`` did not count, when the server scores the space exhaustively."""
    search = (job.get("inputs") or {}).get("search") or {}
    if trials is None or search.get("engine") != "exhaustive":
        return None
    from search.engine import AUTO_EXHAUSTIVE_MAX

    why = (f"sampler auto scores a space of at most {AUTO_EXHAUSTIVE_MAX:,} configs exhaustively"
           if search.get("sampler") == "auto" else "the exhaustive sampler scores the whole space")
    return (f"note: --trials {trials:,} was not used: {why} ({search.get('space_size') or 0:,} configs); "
            "the counts below are configs scored, not trials (pass --sampler tpe to sample)")


def _follow(client, job: dict, timeout_s: float | None, poll_s: float, err) -> dict:
    """Poll the job until it finishes; progress on stderr (a bar on a terminal, lines otherwise)."""
    started = time.monotonic()
    bar = task = None
    if err.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=err, transient=True)
        bar.start()
        task = bar.add_task(job["status"], total=None)
    last_line, last_state = 0.0, None
    try:
        while job["status"] not in FINISHED:
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                raise ClientError(EXIT_TIMEOUT, f"job {job['id']} still {job['status']} after {timeout_s:g} s "
                                                f"(it goes on; follow it with GET /v1/jobs/{job['id']})")
            time.sleep(poll_s)
            job = _get(client, f"/v1/jobs/{job['id']}")
            p = job["progress"]
            if bar is not None:
                bar.update(task, description=f"{job['status']} ({_unit(job)})", completed=p["trials_done"],
                           total=p["trials_total"] or None)
            else:
                state = (job["status"], p["trials_done"])
                if job["status"] != (last_state or ("",))[0] or time.monotonic() - last_line > 10:
                    err.print(f"job {job['id']} {job['status']}: {p['trials_done']:,}/{p['trials_total']:,} "
                              f"{_unit(job)}", highlight=False)
                    last_line, last_state = time.monotonic(), state
    finally:
        if bar is not None:
            bar.stop()
    return job


@click.command()
@click.option("--server", required=True, envvar="PARAPLAN_SERVER", help="Base URL, e.g. http://paraplan:8000.")
@click.option("--model", required=True, help="Preset name, a JSON/YAML spec file, or inline JSON.")
@click.option("--cluster", required=True, help="Profile name, a profile file, or inline JSON.")
@click.option("--devices", required=True, type=int, help="Number of devices.")
@click.option("--global-batch-size", required=True, type=int, help="Sequences per step.")
@click.option("--trials", type=int, default=None, help="Trials for the samplers (server default 500).")
@click.option("--sampler", type=click.Choice(ENGINES), default=None, help="Search engine (server default auto).")
@click.option("--top", "top_k", type=int, default=None, help="How many configs to rank (server default 10).")
@click.option("--seed", type=int, default=None, help="Sampler seed (same seed, same result).")
@click.option("--fix", "fix", multiple=True, metavar="KEY=VALUE", help="Pin a config field (repeatable).")
@click.option("--precision", type=click.Choice(["bf16", "fp8"]), default=None)
@click.option("--moe-load-imbalance", type=float, default=None, help="max/mean routed tokens per EP rank (≥ 1).")
@click.option("--seq-length", type=int, default=None, help="Override the model's seq_length.")
@click.option("--allow-cross-domain-tp", is_flag=True, help="Let tp span more than one scale-up domain.")
@click.option("--search-timeout", type=float, default=None, help="Stop the job's sampling after this many seconds.")
@click.option("--memory-margin-gib", "memory_margin_gib", type=float, default=None,
              help="Memory headroom (GiB) the ranking asks of a config (server default 4; docs/search.md).")
@click.option("--framework", type=click.Choice(["megatron", "mindspeed"]), default=None,
              help="Training framework planned for (server default: mindspeed for Ascend profiles, megatron "
                   "otherwise; docs/search.md).")
@click.option("--wait", is_flag=True, help="Follow the job to its end and print the ranked configs.")
@click.option("--min-mfu", type=float, default=None, help="Exit 5 unless the best config reaches this MFU "
                                                          "(implies --wait).")
@click.option("--timeout", "timeout_s", type=float, default=None, help="Stop waiting after this many seconds "
                                                                       "(exit 6; the job goes on).")
@click.option("--poll", "poll_s", type=float, default=1.0, show_default=True, help="Seconds between polls.")
@click.option("--api-key", envvar="PARAPLAN_API_KEY", default=None, help="API key (default: $PARAPLAN_API_KEY).")
@click.option("--idempotency-key", default=None, help="Idempotency-Key of the submission (default: a new UUID, "
                                                      "reused for retries).")
@click.option("--json", "as_json", is_flag=True, help="Print the job (with its ranked configs as `top`) as JSON.")
@resilience_flags(with_objective=True)
def submit(server, model, cluster, devices, global_batch_size, trials, sampler, top_k, seed, fix, precision,
           moe_load_imbalance, seq_length, allow_cross_domain_tp, search_timeout, memory_margin_gib, framework, wait,
           min_mfu, timeout_s, poll_s, api_key, idempotency_key, as_json, objective, **resilience) -> None:
    """Submit a search job to a ParaPlan server (the CI client); exit 0 only for a usable plan."""
    from rich.console import Console

    from ..common import unused_option

    err = Console(stderr=True, soft_wrap=True)
    unused = None
    if not wait and min_mfu is None:
        unused = unused_option(("timeout_s", "poll_s"), "without --wait or --min-mfu (it paces or bounds following "
                                                        "the job; the job's own limit is --search-timeout)")
    if unused is None and sampler == "exhaustive":
        unused = unused_option(("trials", "seed", "search_timeout"),
                               "with --sampler exhaustive (it scores the whole space; the samplers read it)")
    if unused is not None:
        err.print(f"[red]error:[/red] {unused}", highlight=False)
        sys.exit(EXIT_INPUT)
    try:
        code = _submit(err, server, model, cluster, devices, global_batch_size, trials, sampler, top_k, seed, fix,
                       precision, moe_load_imbalance, seq_length, allow_cross_domain_tp, search_timeout,
                       wait or min_mfu is not None, min_mfu, timeout_s, poll_s, api_key, idempotency_key, as_json,
                       memory_margin_gib, framework, objective, resilience)
    except ClientError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        sys.exit(exc.code)
    except KeyboardInterrupt:
        err.print("interrupted; the job goes on on the server")
        sys.exit(130)
    sys.exit(code)


def _submit(err, server, model, cluster, devices, gbs, trials, sampler, top_k, seed, fix, precision, imbalance,
            seq_length, cross_tp, search_timeout, wait, min_mfu, timeout_s, poll_s, api_key, idem, as_json,
            memory_margin_gib=None, framework=None, objective="throughput", resilience=None) -> int:
    import httpx

    from app.formats.bounds import config_problems, flag_problems
    from app.cli.console import echo

    # The server answers these with a 422 too; the bounds are the same (app/formats/bounds.py), so say it at once.
    for field, problem in flag_problems(devices=devices, global_batch_size=gbs, trials=trials, top=top_k, seed=seed,
                                        seq_length=seq_length, timeout_s=search_timeout,
                                        moe_load_imbalance=imbalance):
        raise ClientError(EXIT_INPUT, f"{field}: {problem}")
    search = {k: v for k, v in (("sampler", sampler), ("n_trials", trials), ("top_k", top_k), ("seed", seed),
                                ("timeout_s", search_timeout), ("memory_margin_gib", memory_margin_gib),
                                ("framework", framework))
              if v is not None}
    if fix:
        search["fixed"] = _fixed(fix)
        for key, problem in config_problems(search["fixed"]):
            raise ClientError(EXIT_INPUT, f"fix.{key}: {problem}")
    if cross_tp:
        search["allow_cross_domain_tp"] = True
    if objective != "throughput":
        search["objective"] = objective
    try:  # the checkpoint options (docs/guides/goodput.md), checked here as the server checks them
        options = resilience_from_flags(resilience or {}).model_dump(exclude_defaults=True)
    except ValueError as exc:  # an InputError naming the field
        raise ClientError(EXIT_INPUT, f"{exc.field}: {exc.reason}") from None
    if options:
        search["resilience"] = options
    body = {"model": _input(model, "model"), "cluster": _input(cluster, "cluster"), "devices": devices,
            "global_batch_size": gbs, "search": search}
    for key, value in (("precision", precision), ("moe_load_imbalance", imbalance), ("seq_length", seq_length)):
        if value is not None:
            body[key] = value
    headers = {"Idempotency-Key": idem or str(uuid.uuid4())}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    with httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=30.0) as client:
        job = _post_with_retries(client, body)
        if not wait:
            if as_json:
                echo(json.dumps(job, indent=2))
            else:
                err.print(f"submitted job {job['id']} ({job['status']}); follow it with --wait or "
                          f"GET {server.rstrip('/')}/v1/jobs/{job['id']}", highlight=False)
                echo(job["id"])
            return EXIT_OK
        client.headers.pop("Idempotency-Key", None)
        job = _follow(client, job, timeout_s, poll_s, err)
        if (note := _trials_note(job, trials)) is not None:  # the engine auto chose is known once the job ran
            err.print(note, highlight=False)
        configs = []
        if job["status"] == "succeeded":
            limit = max(1, min(500, (job["inputs"]["search"] or {}).get("top_k", 10)))
            configs = _get(client, f"/v1/jobs/{job['id']}/configs", {"limit": limit})["items"]
    if as_json:
        echo(json.dumps({**job, "top": configs}, indent=2))
    elif configs:
        _print_table(job, configs)
    if job["status"] != "succeeded":
        err.print(f"[red]job {job['id']} {job['status']}[/red]" + (f": {job['error']}" if job.get("error") else ""),
                  highlight=False)
        return EXIT_FAILED
    best = job.get("best")
    if best is None or not best["evaluation"]["feasible"]:
        smallest = (job.get("summary") or {}).get("smallest_peak_gib")
        where = f": the smallest peak found is {smallest:.1f} GiB" if smallest else ""
        err.print(f"[red]no config fits[/red]{where}", highlight=False)
        return EXIT_NO_FIT
    mfu = best["evaluation"]["mfu"]
    if min_mfu is not None and (mfu is None or mfu < min_mfu):
        err.print(f"[red]best MFU {_fmt(mfu, '.3f')} is below --min-mfu {min_mfu:g}[/red]", highlight=False)
        return EXIT_MIN_MFU
    return EXIT_OK


def _get(client, url: str, params: dict | None = None, tries: int = 5) -> dict:
    """GET with retries over connection failures (a server restarting keeps the job)."""
    import httpx

    for attempt in range(tries):
        try:
            return _check(client.get(url, params=params)).json()
        except httpx.TransportError as exc:
            if attempt == tries - 1:
                raise ClientError(EXIT_SERVER, f"cannot reach {client.base_url} ({exc})") from None
            time.sleep(1.0 * (attempt + 1))
    raise AssertionError("unreachable")


def _post_with_retries(client, body: dict, tries: int = 3) -> dict:
    """POST the job; connection failures are retried with the same Idempotency-Key (no duplicate job)."""
    import httpx

    for attempt in range(tries):
        try:
            return _check(client.post("/v1/jobs", json=body)).json()
        except httpx.TransportError as exc:
            if attempt == tries - 1:
                raise ClientError(EXIT_SERVER, f"cannot reach {client.base_url} ({exc})") from None
            time.sleep(1.0 * (attempt + 1))
    raise AssertionError("unreachable")
