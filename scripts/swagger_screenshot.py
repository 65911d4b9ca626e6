"""Screenshot of the service's Swagger UI (``/docs``) in headless Chromium, with no network but loopback.

Starts ``paraplan serve`` on a free loopback port with a temporary SQLite database (or uses
``--server URL``), opens ``/docs`` in Debian's ``chromium`` (``apt-get install chromium``; browser
downloads are not reachable here) with every host except 127.0.0.1 unresolvable, and writes the PNG.
``tests/test_swagger_ui.py`` runs the same code and checks the picture; docs/guides/service.md shows
``docs/swagger.png``, made with:

    .venv/bin/python scripts/swagger_screenshot.py docs/swagger.png
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WINDOW = (1400, 1600)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-default-apps", "--disable-extensions", "--hide-scrollbars",
                  "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                  f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=5000")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run_chromium(args: list[str], profile: str) -> subprocess.CompletedProcess:
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed (apt-get install -y chromium)")
    return subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def screenshot(url: str, out: Path) -> Path:
    with tempfile.TemporaryDirectory() as profile:
        proc = _run_chromium([f"--screenshot={out}", url], profile)
    if not out.is_file():
        raise RuntimeError(f"chromium wrote no screenshot:\n{proc.stderr[-3000:]}")
    return out


def rendered_dom(url: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        return _run_chromium(["--dump-dom", url], profile).stdout


def read_png(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and the unfiltered rows (RGB or RGBA, 8 bits) of a non-interlaced PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, f"unsupported PNG {header}"
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line) if bpp == 3 else bytes(x for j in range(0, stride, 4) for x in line[j:j + 3]))
        prev = line
    return width, height, rows


def colour_counts(rows: list[bytes], colours: dict[str, tuple[int, int, int]], tol: int = 12) -> dict[str, int]:
    """How many pixels are near each named colour."""
    counts = dict.fromkeys(colours, 0)
    for row in rows[::2]:
        for x in range(0, len(row), 6):
            px = row[x:x + 3]
            for name, (r, g, b) in colours.items():
                if abs(px[0] - r) <= tol and abs(px[1] - g) <= tol and abs(px[2] - b) <= tol:
                    counts[name] += 1
    return counts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="PNG file to write.")
    ap.add_argument("--server", help="Base URL of a running server (default: start one on loopback).")
    args = ap.parse_args(argv)
    proc = tmp = None
    url = args.server
    if url is None:
        import httpx

        tmp = tempfile.TemporaryDirectory()
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--no-worker",
                                 "--log-level", "warning"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                                env={**os.environ, "DATABASE_URL": f"sqlite:///{tmp.name}/docs.db"})
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
    try:
        screenshot(f"{url.rstrip('/')}/docs", args.out)
        print(f"wrote {args.out}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=15)
            tmp.cleanup()


if __name__ == "__main__":
    main()
