"""The command line's modules import each other one way: commands import the shared helpers
(``app/cli/common.py``), ``app/cli/main.py`` imports the commands, and no module of ``app/cli`` imports one that
imports it back (directly or through others). Read from the source with ``ast``, function-level imports
included, since those close a circle just the same when the function runs."""

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[1] / "app" / "cli"


def _module_name(path: Path) -> str:
    parts = ["app", *path.relative_to(CLI.parent).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """Each module of app/cli -> the modules of app/cli its import statements name."""
    files = {_module_name(p): p for p in CLI.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                module = _resolve(name, path.name == "__init__.py", node)
                targets.add(module)
                targets.update(f"{module}.{a.name}" for a in node.names)  # `from pkg import submodule`
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_cli_import_graph_has_no_circle():
    graph = import_graph()
    assert "app.cli.commands.rl" in graph["app.cli.main"]  # the graph sees main's command imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_commands_take_shared_helpers_from_common_not_main():
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith("app.cli.commands"):
            assert "app.cli.main" not in targets, name


def test_the_cycle_finder_sees_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# A plain search runs the exhaustive engine; Optuna and its storage layer (SQLAlchemy) take longer to import
# than a small search takes to run, so they load only when a sampler runs.
_RUN_AND_LIST = """
import sys
from app.cli.main import main
sys.argv = ["paraplan", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print("imported:", ",".join(m for m in ("optuna", "sqlalchemy") if m in sys.modules), file=sys.stderr)
"""


def _heavy_modules_after(*args: str) -> str:
    import os
    import subprocess
    import sys

    root = CLI.parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", _RUN_AND_LIST, "search", "--model", "tiny-moe", "--cluster",
                           "ascend-910b", "--devices", "16", "--global-batch-size", "64", "--json", *args],
                          capture_output=True, text=True, cwd=root, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr.splitlines()[-1].removeprefix("imported:").strip()


def test_an_exhaustive_search_imports_neither_optuna_nor_sqlalchemy():
    assert _heavy_modules_after() == ""
    assert _heavy_modules_after("--sampler", "tpe", "--trials", "4", "--seed", "1") == "optuna,sqlalchemy"
