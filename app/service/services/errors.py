"""HTTP errors in one shape: FastAPI's ``{"detail": [{"loc", "msg", "type"}]}``, naming the field."""

from __future__ import annotations

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError


def invalid(loc: list, msg: str, type_: str = "value_error") -> RequestValidationError:
    """A 422 naming the field (raise it)."""
    return RequestValidationError([{"loc": tuple(loc), "msg": msg, "type": type_}])


def http_error(status: int, loc: list, msg: str, type_: str, headers: dict | None = None) -> HTTPException:
    return HTTPException(status_code=status, detail=[{"loc": list(loc), "msg": msg, "type": type_}],
                         headers=headers)


def not_found(job_id: str) -> HTTPException:
    return http_error(404, ["path", "job_id"], f"no job with id {job_id!r}", "not_found")


def field_loc(field: str, root: str = "body") -> list:
    """``model.num_layers`` -> ``["body", "model", "num_layers"]`` (list indexes as ints)."""
    parts: list = [root]
    for p in field.split("."):
        parts.append(int(p) if p.isdigit() else p)
    return parts
