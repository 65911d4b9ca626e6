"""``paraplan export``: a ranked config as training-script arguments (Megatron-LM or MindSpeed-LLM).

From a file (what ``paraplan search --json`` printed: ``inputs.model`` is the spec, ``top``/``best``
entries carry ``rank`` and ``config``), or from a server job (``GET /v1/jobs/{id}/configs/{rank}/launch``).
Prints the arguments only, one flag per line joined with `` \\`` (see ``app.formats.launch.format_args``).
An RL plan (``paraplan rl --json``, or an ``rl`` job) prints its training side's arguments and its rollout
engine's vLLM / vLLM-Ascend arguments, for ``--mode`` (default: the best plan; ``app.formats.rl_export``).
Bad input (unreadable file, a field missing, rank out of range, unknown format) exits 2 naming the field;
so does a config with an option the format cannot express (``search.frameworks``): the message names the
option and why, and nothing is printed on stdout.
"""

from __future__ import annotations

import json
import os
import sys

import click

from app.formats.launch import ENV_HEADER, FORMATS, InexpressibleError, env_note, format_args, launch_args, launch_env
from app.formats.rl_export import MODES as RL_MODES

EXIT_INPUT, EXIT_SERVER = 2, 7


def _die(field: str, reason: str, code: int = EXIT_INPUT):
    click.echo(f"error: {field}: {reason}", err=True)
    sys.exit(code)


def args_from_result(result, rank: int, fmt: str) -> list[str]:
    """The launch arguments of config ``rank`` of a search result (raises InputError naming the field)."""
    from pydantic import ValidationError

    from app.formats.inputs import InputError, _validated
    from costmodel import ModelSpec, TrainingConfig

    if not isinstance(result, dict):
        raise InputError("result", "must be a JSON object (what `paraplan search --json` prints)")
    inputs = result.get("inputs")
    if not isinstance(inputs, dict) or not isinstance(inputs.get("model"), dict):
        raise InputError("inputs.model", "missing: not a `paraplan search --json` result")
    spec = _validated(ModelSpec, inputs["model"], "inputs.model")
    entries = result.get("top")
    if not isinstance(entries, list):
        entries = [result["best"]] if isinstance(result.get("best"), dict) else []
    by_rank = {e.get("rank"): e for e in entries if isinstance(e, dict)}
    if rank not in by_rank:
        raise InputError("rank", f"{rank} is out of range: the result ranks "
                                 f"{len(by_rank)} config(s)" if by_rank else f"{rank}: the result has no configs")
    config = by_rank[rank].get("config")
    if not isinstance(config, dict):
        raise InputError(f"top.{rank}.config", "missing")
    cfg = _validated(TrainingConfig, config, f"top.{rank}.config")
    try:
        return launch_args(cfg, spec, fmt, _scale_up_domain(inputs.get("cluster")))
    except InexpressibleError as exc:
        raise InputError(f"top.{rank}.config.{exc.field}", str(exc)) from None
    except (ValueError, ValidationError) as exc:
        raise InputError("config", str(exc)) from None


def _scale_up_domain(cluster) -> int | None:
    """Devices per scale-up domain of the result's cluster profile (None when it cannot be loaded here:
    the options that depend on it are then refused, not guessed)."""
    from app.formats.inputs import InputError, load_cluster

    if not isinstance(cluster, str):
        return None
    try:
        return int(load_cluster(cluster).fact("scale_up_domain"))
    except InputError:
        return None


@click.command()
@click.argument("result_file", metavar="RESULT.json", required=False)
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True, help="Training framework.")
@click.option("--rank", type=int, default=None, help="Which ranked config of a search (default 1; not for an RL plan).")
@click.option("--mode", type=click.Choice(RL_MODES), default=None,
              help="An RL plan (`paraplan rl --json`, an rl job): which mode's plan (default: the best).")
@click.option("--server", default=None, help="ParaPlan server URL (with --job).")
@click.option("--job", "job_id", default=None, help="Job id on --server.")
@click.option("--api-key", default=None, help="API key (default: $PARAPLAN_API_KEY).")
def export(result_file, fmt, rank, mode, server, job_id, api_key) -> None:
    """Print a ranked config as Megatron-LM or MindSpeed-LLM training arguments; an RL plan as its training
    arguments and its rollout engine's vLLM / vLLM-Ascend arguments."""
    if rank is not None and rank < 1:
        _die("rank", "must be a positive integer")
    if (result_file is None) == (server is None):
        _die("RESULT.json", "give either RESULT.json or --server URL --job ID")
    if server is not None:
        if not job_id:
            _die("job", "--server needs --job ID")
        _export_job(server, job_id, api_key, fmt, rank, mode)
    else:
        from ..common import unused_option

        if (exc := unused_option(("job_id", "api_key"), "with RESULT.json (they fetch a job from --server)")) is not None:
            _die(exc.field, exc.reason)
        _export_result(_read(result_file), fmt, rank, mode)


def _read(result_file: str):
    try:
        with open(result_file) as fh:
            return json.load(fh)
    except OSError as exc:
        _die("RESULT.json", f"cannot read {result_file!r} ({exc.strerror})")
    except json.JSONDecodeError as exc:
        _die("RESULT.json", f"not valid JSON ({exc})")


def _export_result(result, fmt: str, rank: int | None, mode: str | None) -> None:
    """Print the arguments of a result (a search's config ``rank``, or an RL plan's ``mode``)."""
    from app.formats.inputs import InputError
    from app.formats.rl import is_rl
    from app.formats.rl_export import export_rl

    try:
        if is_rl(result):
            if rank is not None:
                raise InputError("rank", "only for a search result: an RL plan is chosen with --mode")
            text, env = export_rl(result, fmt, mode, _scale_up_domain((result.get("inputs") or {}).get("cluster")))
        elif mode is not None:
            raise InputError("mode", "only for an RL plan (what `paraplan rl --json` prints)")
        else:
            tokens = args_from_result(result, rank or 1, fmt)
            text, env = format_args(tokens), launch_env(tokens)
    except InputError as exc:
        _die(exc.field, exc.reason)
    click.echo(text, nl=False)
    if env:
        click.echo(env_note(env), err=True)


def _get(server: str, path: str, api_key: str | None, **params):
    """GET ``path`` on the server; a failure exits naming it (2 for the caller's error, else 7)."""
    import httpx

    key = api_key or os.environ.get("PARAPLAN_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        resp = httpx.get(f"{server.rstrip('/')}{path}", params=params, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        _die("server", f"cannot reach {server} ({exc})", EXIT_SERVER)
    if resp.status_code != 200:
        try:
            detail = resp.json()["detail"][0]
            msg = f"{'.'.join(str(p) for p in detail['loc'])}: {detail['msg']}"
        except (ValueError, KeyError, IndexError, TypeError):
            msg = resp.text[:300]
        _die("server", f"HTTP {resp.status_code}: {msg}",
             EXIT_INPUT if 400 <= resp.status_code < 500 and resp.status_code != 429 else EXIT_SERVER)
    return resp


def _export_job(server: str, job_id: str, api_key: str | None, fmt: str, rank: int | None,
                mode: str | None) -> None:
    """A server job's arguments: an rl job's from its result (as from its file), a search job's from
    ``GET /v1/jobs/{id}/configs/{rank}/launch``."""
    job = _get(server, f"/v1/jobs/{job_id}", api_key).json()
    if job.get("kind") == "rl":
        if job.get("rl") is None:
            _die("job", f"job {job_id} is {job.get('status')}: no RL plan yet")
        _export_result(job["rl"], fmt, rank, mode)
        return
    if mode is not None:
        _die("mode", f"only for an RL plan; job {job_id} is a {job.get('kind', 'search')} job")
    resp = _get(server, f"/v1/jobs/{job_id}/configs/{rank or 1}/launch", api_key, format=fmt)
    click.echo(resp.text, nl=False)
    env = dict(item.split("=", 1) for item in resp.headers.get(ENV_HEADER, "").split() if "=" in item)
    if env:
        click.echo(env_note(env), err=True)
