"""An option that has no effect where it is given is refused (exit 2 naming it) instead of being ignored:
``submit --timeout`` / ``--poll`` without ``--wait``, the sampler options with ``search --sampler
exhaustive``, ``--study-name`` without ``--storage``, ``report`` / ``export`` of a file with the options
that fetch a job from a server. Where only the run can tell (``--sampler auto`` turning out exhaustive),
stderr says the option was not used."""

from __future__ import annotations

import json

import pytest

from service_util import Server, run_cli

SMALL = ("--model", "tiny-dense", "--cluster", "nvidia-h100-80gb", "--devices", "8", "--global-batch-size", "64")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("unused")
    srv = Server(d / "srv.db", d / "serve.log").start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("option", [("--timeout", "3"), ("--poll", "0.5")])
def test_submit_refuses_wait_options_without_wait_and_submits_nothing(server, option):
    proc = run_cli("submit", "--server", server.url, *SMALL, *option)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert f"error: {option[0]}: has no effect without --wait" in proc.stderr, proc.stderr
    with server.client() as c:
        assert c.get("/v1/jobs").json()["total"] == 0  # refused before anything was sent
    # with --wait the same option is used
    proc = run_cli("submit", "--server", server.url, *SMALL, "--sampler", "exhaustive", "--wait", *option)
    assert proc.returncode == 0, proc.stderr
    with server.client() as c:
        for job in c.get("/v1/jobs").json()["items"]:
            c.delete(f"/v1/jobs/{job['id']}")


@pytest.mark.parametrize("option", [("--trials", "50"), ("--seed", "1"), ("--timeout", "5"),
                                    ("--storage", "sqlite:///unused.db"), ("--study-name", "s")])
def test_search_refuses_sampler_options_with_the_exhaustive_engine(option, tmp_path):
    proc = run_cli("search", *SMALL, "--sampler", "exhaustive", *option)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {option[0]}: has no effect with --sampler exhaustive"), proc.stderr
    assert not (tmp_path / "unused.db").exists()


def test_search_refuses_a_study_name_without_storage():
    proc = run_cli("search", *SMALL, "--sampler", "random", "--trials", "5", "--study-name", "s")
    assert proc.returncode == 2 and "error: --study-name: has no effect without --storage" in proc.stderr, proc.stderr


def test_search_says_when_auto_did_not_use_the_trials():
    proc = run_cli("search", *SMALL, "--trials", "30", "--seed", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engine"] == "exhaustive"
    assert "note: --trials, --seed not used: sampler auto scored the whole space" in proc.stderr, proc.stderr
    proc = run_cli("search", *SMALL, "--json")  # nothing given, nothing said
    assert proc.returncode == 0 and "not used" not in proc.stderr, proc.stderr


def test_report_and_export_of_a_file_refuse_the_server_options(tmp_path):
    proc = run_cli("search", *SMALL, "--json")
    (tmp_path / "r.json").write_text(proc.stdout)
    for args, name in ((("report", str(tmp_path / "r.json"), "-o", str(tmp_path / "r.html"), "--server",
                         "http://127.0.0.1:9"), "--server"),
                       (("report", str(tmp_path / "r.json"), "-o", str(tmp_path / "r.html"), "--api-key", "k"),
                        "--api-key"),
                       (("export", str(tmp_path / "r.json"), "--format", "megatron", "--job", "x"), "--job"),
                       (("export", str(tmp_path / "r.json"), "--format", "megatron", "--api-key", "k"), "--api-key")):
        proc = run_cli(*args)
        assert proc.returncode == 2 and f"error: {name}: has no effect with RESULT.json" in proc.stderr, proc.stderr
    assert not (tmp_path / "r.html").exists()
