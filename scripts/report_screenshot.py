"""Screenshot of a job report (``app/formats/report.py``) in headless Chromium, with no network at all.

Runs a search in memory (default: the Pangu Ultra MoE 718B job on 6,144 Ascend 910B, TPE, 200
trials, seed 7), renders its report, opens the HTML file in Debian's ``chromium`` with every host
unresolvable, and writes the PNG. ``tests/test_report.py`` uses the same functions; docs/guides/reports.md shows
``docs/report.png``, made with:

    .venv/bin/python scripts/report_screenshot.py docs/report.png
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from swagger_screenshot import chromium, read_png  # noqa: E402,F401 - read_png is re-exported for the tests

WINDOW = (1400, 2400)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--hide-scrollbars",
         "--host-resolver-rules=MAP * ~NOTFOUND", f"--window-size={WINDOW[0]},{WINDOW[1]}",
         "--virtual-time-budget=8000")


def _run(args: list[str]) -> subprocess.CompletedProcess:
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                              timeout=180, stdin=subprocess.DEVNULL)


def rendered_dom(html_file: Path) -> str:
    return _run(["--dump-dom", Path(html_file).resolve().as_uri()]).stdout


def screenshot(html_file: Path, out: Path) -> Path:
    out = Path(out).resolve()
    proc = _run([f"--screenshot={out}", Path(html_file).resolve().as_uri()])
    if not out.is_file():
        raise RuntimeError(f"chromium wrote no screenshot:\n{proc.stderr[-3000:]}")
    return out


def search_result(model: str, cluster: str, devices: int, gbs: int, sampler: str, trials: int, seed: int) -> dict:
    """``paraplan search --json``'s output, computed in memory."""
    from app.formats.inputs import load_cluster, load_model
    from search import SearchRequest, run_search

    spec, profile = load_model(model, None), load_cluster(cluster)
    req = SearchRequest(spec=spec, profile=profile, devices=devices, global_batch_size=gbs, sampler=sampler,
                        n_trials=trials, seed=seed)
    result = run_search(req)
    return {"inputs": {"model": spec.model_dump(mode="json", exclude_none=True), "cluster": profile.name,
                       "devices": devices, "global_batch_size": gbs, "precision": "bf16", "moe_load_imbalance": None,
                       "memory_margin_gib": req.memory_margin_gib},
            **result}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="PNG file to write.")
    ap.add_argument("--html", type=Path, help="Also keep the report's HTML here.")
    args = ap.parse_args(argv)
    from app.formats.report import render_report

    result = search_result("pangu-ultra-moe-718b", "ascend-910b", 6144, 7680, "tpe", 200, 7)
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(args.html or Path(tmp) / "report.html")
        page.write_text(render_report(result), encoding="utf-8")
        screenshot(page, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
