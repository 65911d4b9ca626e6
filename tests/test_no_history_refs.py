"""No project-history references in the tracked code, tests and docs: a comment or docstring says the reason
itself (the failure that motivated it, the rule, the measured figure), not the number of the ticket that
asked for it, which a reader of the source cannot open and which means nothing once the ticket is gone.

Every tracked source and documentation file (``git ls-files``: .py .md .yaml .yml .toml .sh .html .js) is
read line by line for an issue number. The only references allowed are to another project's public tracker,
and only in the form that names it right before the number: a repository as ``owner/name`` (as in the H100
profile's source, which cites an nccl-tests thread of NVIDIA's repository), or one of the few projects named
in EXTERNAL_PROJECTS. Each reference on a line is judged on its own, so a line that cites an external thread
cannot carry an internal reference along with it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".html", ".js")
REFERENCE = re.compile(r"\bissues?\s?#?\d+", re.I)
# Projects cited by name alone, whose trackers are public: keep this list to names actually cited.
EXTERNAL_PROJECTS = frozenset({"Alpa"})
# A GitHub repository as "owner/name" (owners are letters, digits and hyphens), not a file path of ours.
REPOSITORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9_.-]+")
FILE_PATH = re.compile(r"\.(?:py|md|ya?ml|toml|sh|html|js|json|txt|cfg|ini)$")


def _names_another_tracker(before: str) -> bool:
    """Whether the word right before a reference (``before`` ends with it and one space) names another
    project's tracker: a repository as owner/name, or a project of EXTERNAL_PROJECTS."""
    if not before.endswith(" "):
        return False
    word = before.split()[-1].lstrip("([\"'`") if before.strip() else ""
    if word in EXTERNAL_PROJECTS:
        return True
    return bool(REPOSITORY.fullmatch(word)) and not FILE_PATH.search(word)


def history_references(line: str) -> list[str]:
    """The issue references of ``line`` that are not another project's (each judged on its own)."""
    return [m.group(0) for m in REFERENCE.finditer(line) if not _names_another_tracker(line[:m.start()])]


def _tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        msg = "not a git work tree (or git is not installed): the tracked files cannot be listed"
        if os.environ.get("CI"):
            pytest.fail(f"{msg}; under CI the check must run", pytrace=False)
        pytest.skip(msg)
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name.endswith(SUFFIXES)]


def test_the_matcher_allows_only_another_projects_tracker():
    assert history_references("    # a degenerate profile exits 2 (issue 19)") == ["issue 19"]
    assert history_references('"""Issue 33: what FP8 costs."""') == ["Issue 33"]
    assert history_references("# the configs of issues 18 and 19") == ["issues 18"]
    assert history_references("# (issue #7) and issue14") == ["issue #7", "issue14"]
    assert history_references('source: "NCCL maintainer on NVIDIA/nccl-tests issue #212: 450 GB/s"') == []
    assert history_references("# measured in Alpa issue 891") == []
    # the allowance is the tracker's name right before the number, not anywhere on the line
    assert history_references("# see NVIDIA/nccl-tests, and issue 12 for why") == ["issue 12"]
    assert history_references("# NVIDIA/nccl-tests issue #212 as issue 19 asked") == ["issue 19"]
    assert history_references("# docs/search.md issue 14") == ["issue 14"]  # a file of ours, not a repository
    assert history_references("# costmodel/evaluate.py issue 19") == ["issue 19"]
    assert history_references("# a/b/c issue 3, Alpa's issue 4, the Alpa-issue 5") == ["issue 3", "issue 4", "issue 5"]
    assert history_references("# the issue with Megatron's default") == []  # the word alone is fine
    assert history_references("(NVIDIA/nccl-tests issue #149, ~200 GB/s)") == []


def test_no_history_references_in_tracked_files():
    files = _tracked_files()
    this = Path(__file__).resolve()
    assert this in files  # the listing found this very file (tracked once committed)
    hits = []
    for path in files:
        if path == this:  # its examples above are the matcher's cases
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if found := history_references(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {', '.join(found)}")
    assert not hits, "project-history references (write the reason itself):\n" + "\n".join(hits)
