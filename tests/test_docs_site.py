"""The documentation site builds offline with ``mkdocs build --strict`` (no broken link or anchor, no page left out
of the navigation, no warning), its generated reference covers what the code has (every command, every route,
every spec field), the built pages load nothing from another host, and the README stays a front page.

MkDocs is the ``docs`` extra (``pip install -e ".[test,docs]"``, as the README's test command and ``.ci/run``
install it); without it the build test skips saying so, and fails under CI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
EXTERNAL_LOAD = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.I)
HISTORY = re.compile(r"\bissues?\s*#?\d+|\bissue's\b", re.I)


def _mkdocs_or_skip() -> None:
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
        import mkdocs_click  # noqa: F401
    except ImportError as exc:
        msg = f"the docs extra is not installed ({exc.name}): pip install -e \".[docs]\""
        if os.environ.get("CI"):
            pytest.fail(f"{msg}; under CI the documentation site must build", pytrace=False)
        pytest.skip(msg)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built as CI builds it: strict, offline (no proxy, no network needed), into a temporary dir."""
    _mkdocs_or_skip()
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1",
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    assert not [ln for ln in log.splitlines() if ln.startswith(("WARNING", "ERROR"))], log
    return out


def _nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def _text(html: str) -> str:
    return re.sub(r"<[^>]+>", " ", html)


def test_every_page_of_the_navigation_is_built_and_loads_nothing_from_another_host(site):
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    pages = _nav_pages(config["nav"])
    assert len(pages) == len(set(pages)) >= 20
    for page in pages:
        html = (site / page).with_suffix(".html").read_text()
        assert not EXTERNAL_LOAD.search(html), page
    # the pages the documentation is organised around
    for page in ["getting-started.md", "guides/moe-on-ascend.md", "guides/service.md", "guides/scale-out.md",
                 "guides/capacity.md", "guides/rl.md", "guides/calibration.md", "guides/launch.md", "costmodel.md",
                 "search.md", "concepts/frameworks.md", "reference/cli.md", "reference/http-api.md",
                 "reference/schema.md", "accuracy.md"]:
        assert page in pages, page


def test_the_cli_reference_has_every_command_and_option(site):
    from app.cli.main import main

    text = _text((site / "reference" / "cli.html").read_text())
    assert "Sentinel" not in text  # click's "no default" marker is no default a user can give
    for name, command in main.commands.items():
        assert f"paraplan {name}" in text, name
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--"):
                    assert opt in text, f"{name} {opt}"


def test_the_http_reference_has_every_route_of_the_application(site):
    sys.path.insert(0, str(ROOT / "scripts"))
    from docs_reference import openapi_document

    doc = openapi_document()
    html = (site / "reference" / "http-api.html").read_text()
    routes = [(m.upper(), p) for p, item in doc["paths"].items() for m in item if m in ("get", "post", "delete")]
    assert len(routes) >= 20
    for method, path in routes:
        assert f"<code>{method} {path}</code>" in html, (method, path)
    for name in doc["components"]["schemas"]:
        assert f'id="{name.lower()}"' in html, name
    import json
    assert json.loads((site / "reference" / "openapi.json").read_text()) == doc


def test_the_schema_reference_has_every_field_of_specs_configs_and_profiles(site):
    from costmodel.spec import ClusterProfile, ModelSpec, TrainingConfig

    text = _text((site / "reference" / "schema.html").read_text())
    for model in (ModelSpec, TrainingConfig, ClusterProfile):
        for field in model.model_fields:
            assert field in text, f"{model.__name__}.{field}"
    import model_presets
    for preset in model_presets.names():
        assert preset in text


def test_the_readme_is_a_front_page_with_the_two_commands_first():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    commands = [ln for ln in readme.splitlines() if ln.startswith("python3 -m venv .venv")]
    assert len(commands) >= 2 and readme.index(commands[0]) < readme.index("## ")
    assert commands[0].split("&& ")[-1].startswith(".venv/bin/paraplan search ")
    assert commands[1].endswith("&& scripts/test")
    ci = (ROOT / ".ci" / "run").read_text()
    install = commands[1].split(" && ")[1]
    assert install in ci and re.search(r"^scripts/test\s*$", ci, re.M)  # CI runs the README's test command
    # every page the README links to exists
    for target in re.findall(r"\]\(([^)#]+\.md)", readme):
        assert (ROOT / target).is_file(), target


def test_no_history_references_in_the_readme_or_the_docs():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        found = HISTORY.findall(path.read_text())
        assert not found, (path.relative_to(ROOT), found)
