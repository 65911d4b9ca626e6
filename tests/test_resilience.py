"""Issue 19 over real HTTP (`paraplan serve` on loopback): a burst of one Idempotency-Key, database
errors as 503, liveness apart from readiness, DELETE of a running job, degenerate profiles.

The bursts are sent with raw asyncio streams (a few microseconds of client CPU per request), so that what
is measured is the server, not an HTTP client sharing the two cores with it."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from service_util import TINY_JOB, Server

BURST = 200


async def raw_request(port: int, method: str, path: str, body: dict | None = None,
                      headers: dict | None = None) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 request on a new connection; (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        payload = json.dumps(body).encode() if body is not None else b""
        head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
                f"Content-Length: {len(payload)}", "Content-Type: application/json",
                *(f"{k}: {v}" for k, v in (headers or {}).items())]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
    head, _, content = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), fields, content


@pytest.mark.parametrize("database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)
def test_burst_of_one_idempotency_key_makes_one_job_and_others_are_answered(database_url, tmp_path):
    """200 concurrent POSTs with one Idempotency-Key: one job, every answer a 202 (the job, or its replay)
    or a 409 `idempotency_in_progress` with Retry-After, no 5xx; meanwhile other requests (liveness, a
    read, a POST with another key), sent one after the other, are each answered within 1 s."""
    server = Server(database_url, tmp_path / "server.log", "--no-worker").start()
    try:
        asyncio.run(_burst(server, tmp_path))
    finally:
        server.stop()


async def _burst(server: Server, tmp_path) -> None:
    port = server.port
    done = asyncio.Event()
    probes: list[tuple[str, int, float]] = []

    async def probe() -> None:
        i = 0
        while not done.is_set() or i < 3:
            for method, path, body, headers in (
                    ("GET", "/healthz", None, None), ("GET", "/v1/jobs?limit=1", None, None),
                    ("POST", "/v1/jobs", TINY_JOB, {"Idempotency-Key": f"other-{i}"})):
                started = time.monotonic()
                status, _, _ = await raw_request(port, method, path, body, headers)
                probes.append((f"{method} {path}", status, time.monotonic() - started))
            i += 1

    async def same_key():
        return await raw_request(port, "POST", "/v1/jobs", TINY_JOB, {"Idempotency-Key": "one-key"})

    # Warm: the first job of a process imports the search and builds its first space (cold, ~1 s).
    status, _, _ = await raw_request(port, "POST", "/v1/jobs", TINY_JOB, {"Idempotency-Key": "warm-up"})
    assert status == 202
    prober = asyncio.create_task(probe())
    await asyncio.sleep(0.05)
    answers = await asyncio.gather(*(same_key() for _ in range(BURST)))
    done.set()
    await prober

    statuses = [status for status, _, _ in answers]
    assert set(statuses) <= {202, 409}, sorted(set(statuses))
    ids = {json.loads(content)["id"] for status, _, content in answers if status == 202}
    assert len(ids) == 1, ids
    for status, fields, content in answers:
        if status == 409:
            detail = json.loads(content)["detail"][0]
            assert detail["type"] == "idempotency_in_progress" and fields["retry-after"] == "1", detail
    # After the burst the key replays its job.
    status, fields, content = await raw_request(port, "POST", "/v1/jobs", TINY_JOB, {"Idempotency-Key": "one-key"})
    assert status == 202 and fields["idempotent-replayed"] == "true" and json.loads(content)["id"] in ids
    status, _, content = await raw_request(port, "GET", "/v1/jobs?limit=200")
    jobs = json.loads(content)["items"]
    others = sum(1 for _, s, _ in probes if s == 202)
    assert len(jobs) == 2 + others, (len(jobs), others)  # the warm-up, the burst's, the probes'
    assert all(s in (200, 202) for _, s, _ in probes), probes
    slow = [p for p in probes if p[2] > 1.0]
    assert not slow, f"answered after more than 1 s during the burst: {slow} of {len(probes)}"
    report = {"statuses": {s: statuses.count(s) for s in set(statuses)},
              "probe_max_s": {name: round(max(d for n, _, d in probes if n == name), 3)
                              for name in {n for n, _, _ in probes}}}
    (tmp_path / "burst.json").write_text(json.dumps(report))
    print("burst:", report)
    assert "QueuePool limit" not in server.log() and "Traceback" not in server.log()
