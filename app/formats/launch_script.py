"""A training launch script read as bash reads it, as far as launch scripts go: the argument list of its
training command, and the launcher's node and process counts.

Teams write these scripts in a few shapes (MindSpeed-LLM's ``examples/mcore/*/pretrain_*.sh``, Megatron-LM's
``examples/*/train_*.sh``): variable assignments (``TP=8``, ``export X=...``, ``${VAR:-default}``,
``$((NNODES*8))``), argument blocks in strings (``GPT_ARGS="..."``, appended with ``GPT_ARGS="$GPT_ARGS ..."``)
or arrays (``MODEL_ARGS=(...)``, ``${MODEL_ARGS[@]}``, ``+=(...)``), line continuations, comments, and one
command that runs the entry script (``pretrain_gpt.py``, ``posttrain_gpt.py``, any ``*.py``) under
``torchrun``, ``python -m torch.distributed.launch`` or ``msrun``, piped to ``tee``. A text with no such
command is read as a plain argument list.

What this reader does not run: command substitutions (``$(nproc)``: a variable holding one is unknown, and an
argument that uses it is an error naming the variable), and the bodies of ``if``/``for``/``while``/``case``
blocks (skipped with a note: which branch runs is decided at launch). Errors are ``ScriptError`` with the
line, never a traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ENTRY = re.compile(r"(^|/)[\w.-]+\.py$")
LAUNCHERS = ("torchrun", "msrun", "python", "python3", "deepspeed")
BLOCK_OPEN = {"if": "fi", "for": "done", "while": "done", "until": "done", "case": "esac"}
UNKNOWN = "\x00unknown:"  # prefix of a value that came from a command substitution


class ScriptError(ValueError):
    """The script cannot be read: ``line`` (1-based, 0 when not tied to one) and why."""

    def __init__(self, line: int, reason: str):
        self.line, self.reason = line, reason
        super().__init__(f"line {line}: {reason}" if line else reason)


@dataclass
class Launch:
    """What a script launches: the entry's argument tokens and, when the launcher states them, the node
    and per-node process counts; ``notes`` say what was skipped."""

    args: list[str]
    entry: str | None = None
    launcher: str | None = None
    nnodes: int | None = None
    nproc_per_node: int | None = None
    notes: list[str] = field(default_factory=list)
    line: int = 0  # the launch command's line
    distributed: bool = False  # python -m torch.distributed.launch / .run

    @property
    def devices(self) -> int | None:
        """nodes × processes per node, when the launcher states both."""
        if self.nproc_per_node is None:
            return None
        return (self.nnodes or 1) * self.nproc_per_node


# ---- words ---------------------------------------------------------------------------------------

@dataclass
class _Word:
    parts: list[tuple[str, str]]  # (text, quoting): "'" literal, '"' expanded without splitting, "" expanded + split
    line: int

    @property
    def raw(self) -> str:
        return "".join(t for t, _ in self.parts)


def _lex(text: str) -> list[list[_Word | str]]:
    """Statements of words; separators (newline, ``;``, ``|``, ``&``) end a statement, and the operators
    ``(`` ``)`` (arrays) and redirections stay as strings."""
    statements: list[list[_Word | str]] = [[]]
    parts: list[tuple[str, str]] = []
    line, i, n = 1, 0, len(text)
    start_line = 1
    in_array = False

    def flush():
        nonlocal parts
        if parts:
            statements[-1].append(_Word(parts, start_line))
            parts = []

    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] == "\n":  # line continuation
            i, line = i + 2, line + 1
            continue
        if c in " \t\r":
            flush()
            i += 1
            continue
        if c == "#" and not parts:
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "\n" and in_array:  # NAME=( ... ) spans lines
            flush()
            line += 1
            i += 1
            continue
        if c in "\n;|&":
            flush()
            if statements[-1]:
                statements.append([])
            if c == "\n":
                line += 1
            i += 1
            continue
        if c in "()":
            in_array = c == "(" and bool(parts) and parts[-1][0].endswith("=") and parts[-1][1] == ""
            flush()
            statements[-1].append(c)
            i += 1
            continue
        if c in "<>":
            flush()
            j = i
            while j < n and text[j] in "<>&0123456789":
                j += 1
            statements[-1].append(">")
            i = j
            continue
        if not parts:
            start_line = line
        if c == "'":
            j = text.find("'", i + 1)
            if j < 0:
                raise ScriptError(line, "unbalanced single quote (')")
            parts.append((text[i + 1:j], "'"))
            line += text.count("\n", i, j)
            i = j + 1
            continue
        if c == '"':
            j, buf = i + 1, []
            while True:
                if j >= n:
                    raise ScriptError(start_line, 'unbalanced double quote (")')
                if text[j] == "\\" and j + 1 < n:
                    if text[j + 1] == "\n":
                        j, line = j + 2, line + 1
                        continue
                    buf.append(text[j + 1] if text[j + 1] in '"\\$`' else text[j:j + 2])
                    j += 2
                    continue
                if text[j] == '"':
                    break
                if text[j] == "$" and text.startswith("$(", j):
                    k = _matching(text, j + 1, start_line)
                    buf.append(text[j:k + 1])
                    j = k + 1
                    continue
                if text[j] == "\n":
                    line += 1
                buf.append(text[j])
                j += 1
            parts.append(("".join(buf), '"'))
            i = j + 1
            continue
        if c == "\\" and i + 1 < n:
            parts.append((text[i + 1], "'"))
            i += 2
            continue
        if c == "$" and text.startswith("$(", i):
            k = _matching(text, i + 1, line)
            parts.append((text[i:k + 1], ""))
            i = k + 1
            continue
        if c == "`":
            j = text.find("`", i + 1)
            if j < 0:
                raise ScriptError(line, "unbalanced backquote (`)")
            parts.append(("$(" + text[i + 1:j] + ")", ""))
            i = j + 1
            continue
        j = i
        while j < n and text[j] not in " \t\r\n;|&'\"\\()<>`" and not text.startswith("$(", j):
            j += 1
        if j == i:  # a lone "$" or similar
            j = i + 1
        parts.append((text[i:j], ""))
        i = j
    flush()
    return [s for s in statements if s]


def _matching(text: str, open_at: int, line: int) -> int:
    """Index of the ``)`` closing the ``(`` at ``open_at``."""
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "(":
            depth += 1
        elif text[k] == ")":
            depth -= 1
            if depth == 0:
                return k
    raise ScriptError(line, "unbalanced parenthesis in $( ... )")


# ---- expansion -----------------------------------------------------------------------------------

_VAR = re.compile(r"\$(?:\{(?P<braced>[^}]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?]))")


class _Env:
    def __init__(self):
        self.scalars: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}

    def value(self, name: str, line: int) -> str | None:
        if name in self.arrays:
            return " ".join(self.arrays[name])
        return self.scalars.get(name)

    def expand_text(self, text: str, line: int) -> str:
        """``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${ARR[@]}``, ``$((arithmetic))`` in ``text``."""
        out, i = [], 0
        while i < len(text):
            if text.startswith("$((", i):
                k = _matching(text, i + 1, line)
                out.append(self._arith(text[i + 3:k - 1], line))
                i = k + 1
                continue
            if text.startswith("$(", i):
                k = _matching(text, i + 1, line)
                out.append(UNKNOWN + text[i:k + 1])
                i = k + 1
                continue
            m = _VAR.match(text, i)
            if not m:
                out.append(text[i])
                i += 1
                continue
            out.append(self._parameter(m.group("braced") if m.group("braced") is not None else m.group("plain"), line))
            i = m.end()
        return "".join(out)

    def _parameter(self, expr: str, line: int) -> str:
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(\[[@*0-9]+\])?(?:(:?[-=+])(.*))?", expr, re.S)
        if not m:
            if expr.startswith("#"):
                return str(len(self.value(expr[1:], line) or ""))
            raise ScriptError(line, f"cannot expand ${{{expr}}}")
        name, index, op, word = m.groups()
        if index and index not in ("[@]", "[*]"):
            arr = self.arrays.get(name, [])
            k = int(index[1:-1])
            val = arr[k] if k < len(arr) else None
        else:
            val = self.value(name, line)
        if op is None:
            return val or ""
        empty = val is None or (op.startswith(":") and val == "")
        if op.endswith("-"):
            return self.expand_text(_unquote(word), line) if empty else val
        if op.endswith("="):
            if empty:
                val = self.scalars[name] = self.expand_text(_unquote(word), line)
            return val
        return self.expand_text(_unquote(word), line) if not empty else ""

    def _arith(self, expr: str, line: int) -> str:
        expr = self.expand_text(expr, line)
        expr = re.sub(r"\b[A-Za-z_][A-Za-z0-9_]*\b", lambda m: self.scalars.get(m.group(0), "0") or "0", expr)
        if UNKNOWN in expr:
            return UNKNOWN + "$((" + expr + "))"
        if not re.fullmatch(r"[\d\s+\-*/%()]*", expr) or "**" in expr or len(expr) > 200:
            # integer arithmetic of a few terms, as launch scripts compute WORLD_SIZE (no powers: unbounded)
            raise ScriptError(line, f"cannot evaluate $(({expr}))")
        try:
            return str(int(eval(expr.replace("/", "//"), {"__builtins__": {}})))  # noqa: S307 - digits and operators only
        except (SyntaxError, ZeroDivisionError, ValueError, MemoryError, RecursionError) as exc:
            raise ScriptError(line, f"cannot evaluate $(({expr})): {exc}") from None

    def words(self, word: _Word) -> list[str]:
        """The fields a word expands to: unquoted parts split on whitespace, quoted parts kept whole;
        ``"${ARR[@]}"`` gives one field per element."""
        fields: list[str] = []
        cur: str | None = None  # the field being built (None: none started)
        for text, quoting in word.parts:
            if quoting == "'":
                cur = (cur or "") + text
                continue
            array = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}", text)
            if quoting == '"' and array and array.group(1) in self.arrays:
                elems = self.arrays[array.group(1)]
                if elems:
                    cur = (cur or "") + elems[0]
                    for e in elems[1:]:
                        fields.append(cur)
                        cur = e
                continue
            expanded = self.expand_text(text, word.line)
            if quoting == '"':
                cur = (cur or "") + expanded
                continue
            for piece in re.split(r"(\s+)", expanded):
                if not piece:
                    continue
                if piece.isspace():
                    if cur is not None:
                        fields.append(cur)
                    cur = None
                else:
                    cur = (cur or "") + piece
        if cur is not None:
            fields.append(cur)
        return fields


def _unquote(word: str) -> str:
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "'\"":
        return word[1:-1]
    return word


# ---- statements ----------------------------------------------------------------------------------

_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")


def read_script(text: str) -> Launch:
    """The launch command of a script (or ``text`` as a plain argument list); raises ``ScriptError``."""
    env, notes, commands = _Env(), [], []
    _run(_lex(text), env, notes, commands)
    launches = [x for x in (_launch(cmd, env) for cmd in commands) if x is not None]
    # the training command: one under a distributed launcher, or running a *train*.py entry, before any
    # helper python script the script runs after it
    launches.sort(key=lambda x: not (x.launcher in ("torchrun", "msrun") or x.distributed
                                     or "train" in (x.entry or "")))
    if launches:
        launch = launches[0]
        _check_known(launch.args, env, launch.line)
        launch.notes = notes + launch.notes
        return launch
    # no entry script: a plain argument list (its words, expanded)
    args = [f for cmd in commands for w in cmd if isinstance(w, _Word) for f in env.words(w)]
    if not args:
        raise ScriptError(0, "no launch command (torchrun/msrun/python ... pretrain_gpt.py) and no arguments found")
    if not args[0].startswith("-"):
        raise ScriptError(0, f"no launch command (torchrun/msrun/python ... pretrain_gpt.py) found, and the text "
                             f"is not an argument list (it starts with {args[0]!r})")
    _check_known(args, env, 0)
    return Launch(args=args, notes=notes)


def _run(statements: list, env: _Env, notes: list[str], commands: list) -> None:
    """Apply the assignments of ``statements`` in order and collect their commands (``eval`` re-read)."""
    depth: list[tuple[str, int]] = []
    for st in statements:
        first = st[0].raw if isinstance(st[0], _Word) else st[0]
        if first in BLOCK_OPEN:
            depth.append((BLOCK_OPEN[first], st[0].line))
            continue
        if depth:
            if first == depth[-1][0]:
                line = depth.pop()[1]
                if not depth:
                    notes.append(f"line {line}: the body of this {_block_name(first)} block was not read "
                                 "(which branch runs is decided at launch)")
            continue
        rest = _assignments(st, env)
        if rest and isinstance(rest[0], _Word) and rest[0].raw == "eval":
            text = " ".join(f for w in rest[1:] if isinstance(w, _Word) for f in env.words(w))
            _run(_lex(text), env, notes, commands)
        elif rest:
            commands.append(rest)
    if depth:
        raise ScriptError(depth[-1][1], f"block not closed (no {depth[-1][0]})")


def _block_name(closer: str) -> str:
    return {"fi": "if", "done": "loop", "esac": "case"}.get(closer, closer)


def _assignments(st: list, env: _Env) -> list:
    """Apply the statement's leading assignments (``export`` and ``local`` too); return the rest."""
    words = list(st)
    if words and isinstance(words[0], _Word) and words[0].raw in ("export", "local", "declare", "readonly"):
        words = words[1:]
        while words and isinstance(words[0], _Word) and words[0].raw.startswith("-"):
            words = words[1:]
        bare_export = True
    else:
        bare_export = False
    while words and isinstance(words[0], _Word):
        w = words[0]
        m = _ASSIGN.match(w.parts[0][0]) if w.parts[0][1] == "" else None
        if not m:
            break
        name, append = m.group(1), m.group(2) == "+"
        if len(words) > 1 and words[1] == "(" and w.raw == m.group(0):  # NAME=( ... )
            close = words.index(")", 1) if ")" in words[1:] else None
            if close is None:
                raise ScriptError(w.line, f"array {name}=( is not closed")
            elems = [f for x in words[2:close] if isinstance(x, _Word) for f in env.words(x)]
            env.arrays[name] = (env.arrays.get(name, []) if append else []) + elems
            env.scalars.pop(name, None)
            words = words[close + 1:]
            continue
        value_word = _Word([(w.parts[0][0][m.end():], "")] + w.parts[1:], w.line)
        value = "".join(_expand_no_split(env, value_word))
        if name in env.arrays and not append:
            env.arrays.pop(name)
        env.scalars[name] = (env.value(name, w.line) or "") + value if append else value
        words = words[1:]
    if bare_export:
        return []
    return words


def _expand_no_split(env: _Env, word: _Word) -> list[str]:
    """An assignment's value: expanded, never split (bash assigns the whole word)."""
    out = []
    for text, quoting in word.parts:
        out.append(text if quoting == "'" else env.expand_text(text, word.line))
    return out


def _launch(cmd: list, env: _Env) -> Launch | None:
    """The launch in a command: words up to the entry script are the launcher's, after it the entry's
    arguments (up to a redirection); None when the command runs no entry script."""
    words = [w for w in cmd if isinstance(w, _Word) or w == ">"]
    if ">" in words:
        words = words[:words.index(">")]
    fields: list[str] = [f for w in words for f in env.words(w)]
    entry_at = next((i for i, f in enumerate(fields) if ENTRY.search(f) and i > 0 or
                     (i == 0 and ENTRY.search(f))), None)
    if entry_at is None:
        return None
    head, args = fields[:entry_at], fields[entry_at + 1:]
    launcher = next((f for f in head if f.rsplit("/", 1)[-1] in LAUNCHERS), None)
    line = next((w.line for w in words if isinstance(w, _Word)), 0)
    nnodes, nproc, notes = _launcher_counts(head, line)
    return Launch(args=args, entry=fields[entry_at].rsplit("/", 1)[-1], launcher=launcher and launcher.rsplit("/", 1)[-1],
                  nnodes=nnodes, nproc_per_node=nproc, notes=notes, line=line,
                  distributed="torch.distributed.launch" in head or "torch.distributed.run" in head)


# launcher options: torchrun / torch.distributed.launch --nnodes, --nproc_per_node (--nproc-per-node);
# msrun --worker_num (all processes) and --local_worker_num (per node)
_NNODES = ("--nnodes",)
_NPROC = ("--nproc_per_node", "--nproc-per-node", "--local_worker_num")
_WORKERS = ("--worker_num",)


def _launcher_counts(head: list[str], line: int) -> tuple[int | None, int | None, list[str]]:
    values: dict[str, str] = {}
    for i, f in enumerate(head):
        key, eq, val = f.partition("=")
        if key in _NNODES + _NPROC + _WORKERS:
            values[key] = val if eq else (head[i + 1] if i + 1 < len(head) else "")
    notes = []

    def num(keys) -> int | None:
        for k in keys:
            if k in values:
                v = values[k]
                if v.startswith(UNKNOWN):
                    notes.append(f"launcher {k} comes from a command ({v[len(UNKNOWN):]}): give --devices")
                    return None
                nodes = v.split(":")[-1]  # torchrun accepts MIN:MAX nodes
                if not nodes.isdigit() or int(nodes) < 1:
                    raise ScriptError(line, f"launcher {k} {v!r} is not a positive integer")
                return int(nodes)
        return None

    nnodes, nproc, workers = num(_NNODES), num(_NPROC), num(_WORKERS)
    if workers is not None:  # msrun: all workers, and per node
        if nproc:
            return workers // nproc, nproc, notes
        return 1, workers, notes
    return nnodes, nproc, notes


def _check_known(args: list[str], env: _Env, line: int) -> None:
    for a in args:
        if UNKNOWN in a:
            raise ScriptError(line, f"argument {a.replace(UNKNOWN, '')!r} takes its value from a command "
                                    "substitution, which is decided at launch: write the value")
