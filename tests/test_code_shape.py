"""The cost model stays readable in one pass: one short function per physical effect.

Every function (methods and nested functions included) of ``costmodel/`` is at most 80 lines, and the
scorer's composition ``costmodel.evaluate._score``, which reads like the step's time breakdown, at
most 60: an effect added to the model gets a function of its own instead of growing the centre.
"""

from __future__ import annotations

import ast
from pathlib import Path

COSTMODEL = Path(__file__).resolve().parents[1] / "costmodel"
MAX_LINES = 80
SCORE_MAX_LINES = 60


def _functions(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_costmodel_function_over_80_lines():
    modules = sorted(COSTMODEL.glob("*.py"))
    assert len(modules) > 10  # the package is where it should be: a wrong path would pass vacuously
    long = [f"{p.name}:{line} {name} ({n} lines)" for p in modules for name, line, n in _functions(p)
            if n > MAX_LINES]
    assert not long, "split these into one function per effect: " + ", ".join(long)


def test_score_composes_the_effects_in_at_most_60_lines():
    lengths = {name: n for name, _, n in _functions(COSTMODEL / "evaluate.py")}
    assert lengths["_score"] <= SCORE_MAX_LINES, lengths["_score"]
