"""Reference pages generated from the code when the documentation site builds (an MkDocs hook, ``mkdocs.yml``).

Each page is rendered from the object the program itself uses, so the site cannot drift from it:

- ``reference/http-api.md`` (and ``reference/openapi.json``) from the FastAPI application's OpenAPI document,
  built in process with no database and no network;
- ``reference/schema.md`` from the pydantic models a preset, a config and a profile are validated by
  (``costmodel/spec.py``): every field with its type, default, bounds and the comment the source gives it;
- ``reference/settings.md`` from the service's settings (``app/service/core/config.py``).

The CLI reference is rendered by the ``mkdocs-click`` extension from the click commands directly
(``docs/reference/cli.md``). Run this file alone to print one page: ``python scripts/docs_reference.py schema``.
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
import textwrap
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the hook imports the project from the checkout the site is built from
    sys.path.insert(0, str(ROOT))


# ---------------------------------------------------------------------------------------------- helpers

def _cell(text) -> str:
    """One Markdown table cell: no line breaks, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text) -> str:
    return f"`{text}`" if text not in ("", None) else ""


# ------------------------------------------------------------------------------------------- HTTP API

METHODS = ("get", "post", "put", "patch", "delete")


def openapi_document() -> dict:
    """The service's OpenAPI document, as ``GET /openapi.json`` serves it (no database is opened)."""
    from app.service.core.config import Settings
    from app.service.main import create_app

    return create_app(Settings(database_url="sqlite://"), migrate=False).openapi()


def _schema_type(s: dict) -> str:
    """A short type for a JSON schema: ``JobCreate``, ``integer``, ``array of string``, ``a | b``."""
    if "$ref" in s:
        name = s["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if "const" in s:
        return f"`{json.dumps(s['const'])}`"
    if "enum" in s:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in s["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        if key in s:
            return " \\| ".join(_schema_type(x) for x in s[key])
    t = s.get("type")
    if t == "array":
        return f"array of {_schema_type(s.get('items', {}))}"
    if t == "object" and isinstance(s.get("additionalProperties"), dict):
        return f"object of {_schema_type(s['additionalProperties'])}"
    return t or "any"


def _bounds(s: dict) -> str:
    parts = []
    for key, word in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"),
                      ("minLength", "length ≥"), ("maxLength", "length ≤"), ("minItems", "items ≥"),
                      ("maxItems", "items ≤")):
        if key in s:
            parts.append(f"{word} {s[key]}")
    for x in s.get("anyOf", []):
        b = _bounds(x)
        if b:
            parts.append(b)
    return ", ".join(parts)


def _operation(path: str, method: str, op: dict) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", ""]
    if op.get("summary"):
        lines += [f"**{op['summary']}**", ""]
    if op.get("description"):
        lines += [textwrap.dedent(op["description"]).strip(), ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for p in params:
            s = p.get("schema", {})
            desc = p.get("description") or s.get("description", "")
            bounds = _bounds(s)
            lines.append(f"| `{p['name']}` | {p['in']} | {_schema_type(s)} | {'yes' if p.get('required') else 'no'} "
                         f"| {_cell(desc)}{' (' + bounds + ')' if bounds else ''} |")
        lines.append("")
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            lines += [f"Request body ({media}): {_schema_type(content.get('schema', {}))}", ""]
    lines += ["| status | meaning | body |", "|---|---|---|"]
    for status, resp in op.get("responses", {}).items():
        bodies = ", ".join(f"{_schema_type(c.get('schema', {}))} ({m})" for m, c in resp.get("content", {}).items()
                           if c.get("schema"))
        lines.append(f"| {status} | {_cell(resp.get('description', ''))} | {bodies} |")
    return lines + [""]


def _component(name: str, s: dict) -> list[str]:
    lines = [f"### `{name}` {{ #{name.lower()} }}", ""]
    if s.get("description"):
        lines += [textwrap.dedent(s["description"]).strip(), ""]
    if "enum" in s:
        return lines + ["One of " + ", ".join(f"`{json.dumps(v)}`" for v in s["enum"]) + ".", ""]
    props = s.get("properties", {})
    if not props:
        return lines + [f"Type: {_schema_type(s)}.", ""]
    required = set(s.get("required", []))
    lines += ["| field | type | required | default | description |", "|---|---|---|---|---|"]
    for field, fs in props.items():
        default = _code(json.dumps(fs["default"])) if "default" in fs else ""
        bounds = _bounds(fs)
        desc = _cell(fs.get("description", "")) + (f" ({bounds})" if bounds else "")
        lines.append(f"| `{field}` | {_schema_type(fs)} | {'yes' if field in required else 'no'} | {default} | {desc} |")
    return lines + [""]


def http_api_page(doc: dict) -> str:
    info = doc["info"]
    lines = ["# HTTP API", "",
             f"Generated from the service's OpenAPI document ({info['title']} {info['version']}, OpenAPI "
             f"{doc['openapi']}) when this site was built. A running server serves the same document at "
             "`/openapi.json` and Swagger UI at `/docs`; the document itself: [openapi.json](openapi.json).", "",
             textwrap.dedent(info.get("description", "")).strip(), ""]
    tags = [t["name"] for t in doc.get("tags", [])]
    by_tag: dict[str, list[tuple[str, str, dict]]] = {}
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                op = item[method]
                tag = (op.get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append((path, method, op))
                if tag not in tags:
                    tags.append(tag)
    descriptions = {t["name"]: t.get("description", "") for t in doc.get("tags", [])}
    for tag in tags:
        if tag not in by_tag:
            continue
        lines += [f"## {tag.capitalize()}", "", descriptions.get(tag, ""), ""]
        for path, method, op in by_tag[tag]:
            lines += _operation(path, method, op)
    lines += ["## Schemas", ""]
    for name, s in sorted(doc.get("components", {}).get("schemas", {}).items()):
        lines += _component(name, s)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- schema

def _field_comments(cls) -> dict[str, str]:
    """Each field's comment in the class source: the ``#`` lines just above it and the one on its line."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    tree = ast.parse(source).body[0]
    comments: dict[str, str] = {}
    for node in tree.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, i = [], node.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#"):
            above.insert(0, lines[i].strip().lstrip("#").strip())
            i -= 1
        own = lines[node.end_lineno - 1]
        inline = own.split("  # ", 1)[1].strip() if "  # " in own else ""
        comments[node.target.id] = " ".join(x for x in (" ".join(above), inline) if x)
    return comments


def _type_name(annotation) -> str:
    """A field's type as a user reads it: ``int``, ``int or None``, ``'flat', 'hierarchical' or None``."""
    text = annotation.__name__ if isinstance(annotation, type) else repr(annotation)
    for noise in ("typing.", "annotated_types.", "costmodel.spec."):
        text = text.replace(noise, "")
    text = text.replace("Annotated[int, Gt(gt=0)]", "PositiveInt").replace("NoneType", "None")
    if text.startswith("Optional[") and text.endswith("]"):
        text = text[len("Optional["):-1] + " | None"
    if text.startswith("Union[") and text.endswith("]"):
        text = text[len("Union["):-1].replace(", list", " | list").replace(", ", ", ")
    text = text.replace("PositiveInt", "int > 0")
    return text.replace(" | ", " or ")


def _constraints(info) -> str:
    words = []
    for m in info.metadata:
        for attr, word in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            v = getattr(m, attr, None)
            if v is not None:
                words.append(f"{word} {v}")
    return ", ".join(words)


def _model_table(cls) -> list[str]:
    comments = _field_comments(cls)
    lines = ["| field | type | default | notes |", "|---|---|---|---|"]
    for name, info in cls.model_fields.items():
        default = "required" if info.is_required() else _code(json.dumps(info.get_default(call_default_factory=True),
                                                                           default=str))
        bounds = _constraints(info)
        note = _cell(info.description or comments.get(name, ""))
        if bounds:
            note = f"{bounds}. {note}" if note else bounds
        lines.append(f"| `{name}` | `{_type_name(info.annotation)}` | {default} | {note} |")
    return lines + [""]


def _doc(cls) -> str:
    return textwrap.dedent(cls.__doc__ or "").strip()


def schema_page() -> str:
    import yaml

    import model_presets
    from costmodel import spec

    lines = ["# Profile, preset and config schema", "",
             "Generated from the pydantic models that validate every model spec, training config and cluster "
             "profile (`costmodel/spec.py`) when this site was built. The notes are the comments the source gives "
             "each field. [Profiles and presets](../profiles.md) explains how the files are written and where their "
             "numbers come from.", ""]
    lines += ["## Model spec (`ModelSpec`)", "", _doc(spec.ModelSpec), "",
              "A preset (`model_presets/<name>.yaml`), a spec file given to `--model`, or the `model` of an API "
              "request. A file or mapping may start from a preset with `\"base\": \"<preset>\"` and override any "
              "field; `source`, `sources` and `notes` keys are documentation and are not validated as fields.", ""]
    lines += _model_table(spec.ModelSpec)
    lines += ["## Training config (`TrainingConfig`)", "", _doc(spec.TrainingConfig), "",
              "What `paraplan evaluate --config` reads and what a search ranks (`config` in every result).", ""]
    lines += _model_table(spec.TrainingConfig)
    lines += ["## Cluster profile (`ClusterProfile`)", "", _doc(spec.ClusterProfile), ""]
    lines += _model_table(spec.ClusterProfile)
    lines += ["Every entry of `facts` and `efficiency` is a `Fact`:", ""]
    lines += _model_table(spec.Fact)
    lines += ["Required `facts`: " + ", ".join(f"`{k}`" for k in spec.REQUIRED_FACTS) + ".", "",
              "Optional `facts` (the host link; activation offload needs all three): "
              + ", ".join(f"`{k}`" for k in spec.HOST_FACTS) + ".", "",
              "Required `efficiency` factors: " + ", ".join(f"`{k}`" for k in spec.EFFICIENCY_KEYS) + ".", "",
              "Optional `efficiency` factors (with the value a profile without them gets): "
              + ", ".join(f"`{k}` ({v})" for k, v in spec.OPTIONAL_EFFICIENCY.items()) + ".", ""]
    lines += ["`calibration` (`CalibrationInfo`): " + _doc(spec.CalibrationInfo), ""]
    lines += _model_table(spec.CalibrationInfo)

    lines += ["## Shipped model presets", "", "| preset | layers | hidden | experts (top-k) | sequence |",
              "|---|--:|--:|---|--:|"]
    for name in model_presets.names():
        m = model_presets.load(name)
        experts = f"{m.num_experts} ({m.moe_router_topk})" if m.num_experts else "dense"
        lines.append(f"| `{name}` | {m.num_layers} | {m.hidden_size} | {experts} | {m.seq_length} |")
    lines += ["", "## Shipped cluster profiles", "", "| profile | description |", "|---|---|"]
    for path in sorted((ROOT / "hardware_profiles").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        lines.append(f"| `{raw['name']}` | {_cell(raw.get('description', ''))} |")
    return "\n".join(lines + [""])


# -------------------------------------------------------------------------------------------- settings

def settings_page() -> str:
    from app.service.core.config import Settings

    lines = ["# Service settings", "",
             "Generated from the service's settings (`app/service/core/config.py`) when this site was built. Each is "
             "read from the environment as `PARAPLAN_<NAME>` (upper case), except `DATABASE_URL` and the other "
             "names given in the first column. Limits a setting may only lower are bounded above by the "
             "hard bounds of every input ([Inputs, outputs and exit codes](conventions.md)).", "",
             "| variable | type | default | description |", "|---|---|---|---|"]
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        choices = getattr(alias, "choices", None) if alias is not None else None
        env = " / ".join(str(c) for c in choices) if choices else f"PARAPLAN_{name.upper()}"
        bounds = _constraints(info)
        desc = _cell(info.description or "") + (f" ({bounds})" if bounds else "")
        lines.append(f"| `{env}` | `{_type_name(info.annotation)}` | {_code(json.dumps(info.default))} | {desc} |")
    return "\n".join(lines + [""])


# ------------------------------------------------------------------------------------------ MkDocs hook

def pages() -> dict[str, str]:
    doc = openapi_document()
    return {
        "reference/http-api.md": http_api_page(doc),
        "reference/openapi.json": json.dumps(doc, indent=2),
        "reference/schema.md": schema_page(),
        "reference/settings.md": settings_page(),
    }


def on_files(files, config):
    """MkDocs hook: add the generated pages to the site (they are never written into docs/)."""
    from mkdocs.structure.files import File

    for uri, content in pages().items():
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_content(html, page, config, files):
    """MkDocs hook: an option without a default shows an empty cell, not click's internal ``Sentinel.UNSET``
    (click 8.2 and later mark "no default" with it, which mkdocs-click prints as it is)."""
    if page.file.src_uri == "reference/cli.md":
        html = html.replace("<td><code>Sentinel.UNSET</code></td>", "<td></td>")
    return html


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "schema"
    print(pages()[f"reference/{which}.md" if which != "openapi" else "reference/openapi.json"])
