"""Every table that describes ranked configs shows every choice that differs between two of them, offload
included: ``paraplan search``'s layouts table, ``paraplan submit``'s table (a real server) and the report's
configs and layouts tables. The search is Llama-3 70B on 64 Ascend 910B, where the best plans swap the
attention modules to host memory and several ranked configs differ only in their pipeline layer layout."""

from __future__ import annotations

import html
import itertools
import json
import re

import pytest

from service_util import Server, run_cli

ARGS = ("--model", "llama3-70b", "--cluster", "ascend-910b", "--devices", "64", "--global-batch-size", "64")


def _rows(table: str, col: int) -> list[str]:
    """The text of column ``col`` of a rich table printed to a pipe, each row's wrapped lines joined (a row
    starts where the rank cell is not empty), the break points ``wrappable`` adds taken out again."""
    rows = []
    for line in table.splitlines():
        cells = line.split("│")
        if line.startswith("│"):  # a table with edges: the first cell is the rank
            cells = cells[1:]
        if len(cells) <= col:
            continue
        text = cells[col].strip()
        if cells[0].strip():
            rows.append(text)
        elif rows:
            rows[-1] += " " + text
    return [r.replace(" (", "(").replace(" +", "+").strip() for r in rows]


def _offload(cfg: dict) -> str:
    return f"offload({'+'.join(cfg['offload_modules'])})"


@pytest.fixture(scope="module")
def result():
    proc = run_cli("search", *ARGS, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _assert_told_apart(configs: list[dict], texts: list[str]):
    assert len(texts) == len(configs)
    for (a, ta), (b, tb) in itertools.combinations(zip(configs, texts), 2):
        if a != b:
            assert ta != tb, (ta, {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)})
    for cfg, text in zip(configs, texts):
        if cfg.get("offload_modules"):
            assert _offload(cfg) in text, text


def test_the_premise_ranked_configs_swap_and_some_differ_only_beyond_the_old_columns(result):
    configs = [e["config"] for e in result["top"]]
    assert configs[0]["offload_modules"]
    assert any(a != b and {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} <= {"pipeline_layout"}
               for a, b in itertools.combinations(configs, 2))


def test_search_table_shows_offload_of_every_layout(result):
    proc = run_cli("search", *ARGS)
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout.split("memory at each layout")[0], 1)
    _assert_told_apart([lay["config"] for lay in result["layouts"]], rows)
    assert "offload(" in rows[0] and "recompute=" in rows[0]


def test_report_tables_tell_every_ranked_config_apart(result, tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(result))
    proc = run_cli("report", str(tmp_path / "r.json"), "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "r.html").read_text()
    tables = re.findall(r'<table class="top( layouts)?"><thead>.*?</thead><tbody>(.*?)</tbody></table>', page, re.S)
    cells = {bool(kind): [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
                          for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)] for kind, body in tables}
    _assert_told_apart([e["config"] for e in result["top"]], [r[1] for r in cells[False]])
    _assert_told_apart([lay["config"] for lay in result["layouts"]], [r[1] + " " + r[2] for r in cells[True]])


def test_submit_table_tells_every_ranked_config_apart(tmp_path):
    srv = Server(tmp_path / "srv.db", tmp_path / "serve.log").start()
    try:
        proc = run_cli("submit", "--server", srv.url, *ARGS, "--sampler", "exhaustive", "--wait", "--poll", "0.2",
                       timeout=300)
        assert proc.returncode == 0, proc.stderr
        job_id = re.search(r"job (\S+) ", proc.stdout).group(1)
        with srv.client() as c:
            configs = [e["config"] for e in c.get(f"/v1/jobs/{job_id}/configs", params={"limit": 10}).json()["items"]]
    finally:
        srv.stop()
    rows = _rows(proc.stdout.split("best config:")[0], 1)
    _assert_told_apart(configs, rows)
