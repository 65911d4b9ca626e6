"""Swagger UI at /docs, opened by headless Chromium (Debian's `chromium`) from the running service with
no network but loopback: the page renders with the jobs endpoints, from local assets only."""

from __future__ import annotations

import sys

import pytest

from service_util import ROOT, require_chromium, running_server

sys.path.insert(0, str(ROOT / "scripts"))
import swagger_screenshot as shot  # noqa: E402

sys.path.pop(0)

# Swagger UI's operation colours (POST green, GET blue, DELETE red) and its header text colour.
SWAGGER_COLOURS = {"post": (73, 204, 144), "get": (97, 175, 254), "delete": (249, 62, 62)}


@pytest.fixture(scope="module")
def chromium():
    return require_chromium(shot.chromium)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory, "docs", "--no-worker") as srv:
        yield srv


def test_swagger_ui_renders_the_jobs_endpoints_with_no_network(chromium, server, tmp_path):
    dom = shot.rendered_dom(f"{server.url}/docs")
    for text in ("ParaPlan", "/v1/jobs", "/v1/jobs/{job_id}/configs", "/v1/jobs/{job_id}/cancel", "/v1/evaluate",
                 "Submit a search job", "The job's ranked configs"):
        assert text in dom, text
    assert "Failed to load" not in dom and "Unable to render" not in dom

    png = shot.screenshot(f"{server.url}/docs", tmp_path / "docs.png")
    assert png.stat().st_size > 30_000
    width, height, rows = shot.read_png(png)
    assert (width, height) == shot.WINDOW
    assert len(set(rows)) > 100  # not blank
    counts = shot.colour_counts(rows, SWAGGER_COLOURS)
    assert all(n > 200 for n in counts.values()), counts  # POST, GET and DELETE operation blocks are drawn
