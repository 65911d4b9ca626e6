"""The container files against the README's install command and the container guide (no container engine runs
here): the Dockerfile's base image, user, install line, entry point, health check and port; compose.yaml's
PostgreSQL, API and two workers on one DATABASE_URL."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[1]


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))
    out = []
    for line in text.splitlines():
        if line.strip():
            op, _, args = line.strip().partition(" ")
            out.append((op.upper(), args.strip()))
    return out


def _one(ins, op) -> str:
    found = [a for o, a in ins if o == op]
    assert len(found) == 1, (op, found)
    return found[0]


def _exec_form(args: str) -> list[str]:
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def _install_target(command: str) -> tuple[str, bool, set[str]]:
    """``pip install -e ".[a,b]"`` -> (".", True, {"a", "b"})."""
    words = shlex.split(command)
    i = words.index("install")
    editable, target = False, None
    for w in words[i + 1:]:
        if w in ("-e", "--editable"):
            editable = True
        elif not w.startswith("-"):
            target = w
            break
    base, _, extras = target.partition("[")
    return base, editable, {e.strip() for e in extras.rstrip("]").split(",") if e.strip()}


def _readme_install() -> tuple[str, bool, set[str]]:
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("# 1. "):]
    cmd = block.splitlines()[1]
    return _install_target(cmd[cmd.index("pip install"):].split("&&")[0])


def test_dockerfile_matches_the_readme_setup():
    ins = dockerfile()
    assert ins[0] == ("FROM", "python:3.11-slim")
    user = _one(ins, "USER")
    assert user.split(":")[0] not in ("root", "0")
    assert any(o == "RUN" and "useradd" in a and user.split(":")[0] in a for o, a in ins)

    runs = [a for o, a in ins if o == "RUN" and "pip install" in a]
    assert len(runs) == 1
    base, editable, extras = _install_target(runs[0])
    r_base, r_editable, r_extras = _readme_install()
    assert (base, editable) == (r_base, r_editable) == (".", True)  # the project itself, as the README installs it
    assert extras == r_extras | {"postgres"}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    optional = pyproject["project"]["optional-dependencies"]
    assert extras <= set(optional) and any(d.startswith("psycopg[binary]") for d in optional["postgres"])
    # the image holds what the install and `paraplan serve` need (packages, migrations, alembic.ini)
    copied = " ".join(a for o, a in ins if o == "COPY")
    for need in [*pyproject["tool"]["setuptools"]["packages"]["find"]["include"], "migrations", "alembic.ini",
                 "pyproject.toml", "README.md"]:
        assert need.rstrip("*") in copied, need
    user_at = [o for o, _ in ins].index("USER")
    assert user_at > [o for o, a in ins].index("RUN") and all(o != "RUN" for o, _ in ins[user_at:])

    cmd = _exec_form(_one(ins, "ENTRYPOINT")) + _exec_form(_one(ins, "CMD"))
    assert cmd[:2] == ["paraplan", "serve"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    port = cmd[cmd.index("--port") + 1]
    assert _one(ins, "EXPOSE") == port == "8000"

    health = _one(ins, "HEALTHCHECK")
    assert "urllib" in health and f"127.0.0.1:{port}/healthz" in health and "curl" not in health


def test_compose_runs_postgres_the_api_and_two_workers_on_one_database():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    pg = [n for n, s in services.items() if str(s.get("image", "")).startswith("postgres:16")]
    assert len(pg) == 1
    db = services[pg[0]]["environment"]

    def command(s) -> list[str]:
        c = s.get("command", [])
        return c if isinstance(c, list) else shlex.split(c)

    api = [s for s in services.values() if command(s)[:1] == ["serve"]]
    workers = [s for s in services.values() if command(s)[:1] == ["worker"]]
    assert len(api) == 1 and len(workers) == 2
    assert "8000:8000" in api[0]["ports"] and api[0].get("build") == "."
    urls = {s["environment"]["DATABASE_URL"] for s in api + workers}
    assert len(urls) == 1
    url = urlsplit(urls.pop())
    assert url.scheme == "postgresql+psycopg" and url.hostname == pg[0] and url.port == 5432
    assert (url.username, url.password, url.path.lstrip("/")) == (db["POSTGRES_USER"], db["POSTGRES_PASSWORD"],
                                                                 db["POSTGRES_DB"])
    images = {s.get("image") for s in api + workers}
    assert len(images) == 1  # one image for the API and its workers
    for s in api + workers:
        assert pg[0] in s["depends_on"]


def test_the_docs_document_the_container():
    section = (ROOT / "docs" / "guides" / "container.md").read_text()
    for text in ("docker build -t paraplan .", "docker compose up", "compose.yaml", "postgresql+psycopg://",
                 '".[postgres]"', "/healthz"):
        assert text in section, text
