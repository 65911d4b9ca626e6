"""Request bodies a client can send that JSON allows but the service cannot keep or answer with, checked
once before any route sees them, and answers that can carry such text.

* A lone UTF-16 surrogate (``"\\ud800"``): valid JSON, not Unicode text. Echoed in a 422 or stored (a
  measurement's ``notes``), it made every later answer holding it fail to encode, for ever.
* A NUL character (``"\\u0000"``): PostgreSQL refuses it in text and JSON columns.
* Nesting deeper than ``MAX_JSON_DEPTH``: no input of the API nests beyond a dozen levels, and a few
  hundred make the serialiser give up.
* A number of more digits than Python converts (4,300).

Each is a 422 naming the field (``["body", ...path]``) and the reason, before anything is parsed into a
model or stored. ``SafeJSONResponse`` answers text that is already stored with such characters (rows
written before this check) with U+FFFD in their place instead of failing.
"""

from __future__ import annotations

import json
import re

from fastapi.responses import JSONResponse

MAX_JSON_DEPTH = 32
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")


def _reason(text: str) -> str:
    bad = _BAD_CHAR.search(text).group()
    return "contains a NUL character (\\u0000)" if bad == "\x00" else \
        "contains a lone UTF-16 surrogate (not Unicode text)"


def body_problem(body: bytes) -> dict | None:
    """The first problem of a JSON body as a 422 detail item (``loc``, ``msg``, ``type``), or None (also for
    a body that is not JSON at all: the route's own parsing reports that)."""
    try:
        data = json.loads(body)
    except RecursionError:
        return {"loc": ["body"], "msg": f"nested deeper than {MAX_JSON_DEPTH} levels", "type": "json_too_deep"}
    except ValueError as exc:
        if "digits" in str(exc):  # int conversion limit of a huge number literal
            return {"loc": ["body"], "msg": "a number has more digits than any input needs (over 4,300)",
                    "type": "number_too_long"}
        return None
    return value_problem(data, ["body"])


def value_problem(data, loc: list) -> dict | None:
    """Walk ``data`` (iteratively: no recursion on hostile depth) for the first bad string or key, or a
    container nested deeper than ``MAX_JSON_DEPTH``."""
    stack = [(data, loc)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if _BAD_CHAR.search(value):
                return {"loc": path, "msg": _reason(value), "type": "string_unsupported"}
            continue
        if isinstance(value, (dict, list)) and len(path) > MAX_JSON_DEPTH:
            return {"loc": path, "msg": f"nested deeper than {MAX_JSON_DEPTH} levels", "type": "json_too_deep"}
        if isinstance(value, dict):
            for key, item in value.items():
                if _BAD_CHAR.search(key):
                    return {"loc": [*path, clean_text(key)], "msg": "the key " + _reason(key),
                            "type": "string_unsupported"}
                stack.append((item, [*path, key]))
        elif isinstance(value, list):
            stack.extend((item, [*path, i]) for i, item in enumerate(value))
    return None


def clean_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (what a UTF-8 decoder shows for bad bytes)."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace") if _BAD_CHAR.search(text) else text


def clean(value):
    """``value`` (JSON-like data) with every string and key through ``clean_text``."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


class SafeJSONResponse(JSONResponse):
    """JSON that always encodes: text with lone surrogates (stored before bodies were checked, or echoed
    from a path) is answered with U+FFFD in their place, not a 500."""

    def render(self, content) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(clean(content))
