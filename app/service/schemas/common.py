"""Shapes shared by every route: the error body and the page of a listing."""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel, Field

T = TypeVar("T")


class ErrorItem(BaseModel):
    loc: list[str | int] = Field(description="Where: `body`/`path`/`query`/`header`, then the field.",
                                 examples=[["body", "model", "num_layers"]])
    msg: str = Field(description="Why, in words.", examples=["Field required"])
    type: str = Field(description="A machine-readable kind of error.", examples=["missing"])


class ErrorResponse(BaseModel):
    """Every 4xx answer: FastAPI's validation-error shape, one item per problem."""

    detail: list[ErrorItem]


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int = Field(description="How many items match, over all pages.")
    limit: int = Field(description="The page size asked for.")
    offset: int = Field(description="How many matching items come before this page.")


# Bounds of the paging and rank parameters (declared in the OpenAPI document; beyond them is a 422).
MAX_PAGE_SIZE = 500
MAX_OFFSET = 1_000_000_000


def error_doc(description: str, loc: list, msg: str, type_: str, headers: dict | None = None) -> dict:
    """An error answer for ``responses=``: always ``application/json`` with the ``ErrorResponse`` schema.

    The schema is written out under ``application/json`` (and ``model`` registers the component): FastAPI
    would also put a ``model`` under the route's own media type, which is wrong for the text and HTML
    routes; those take ``text_route(...)`` of these dicts, which drops ``model``."""
    doc = {"model": ErrorResponse, "description": description,
           "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"},
                                            "example": {"detail": [{"loc": loc, "msg": msg, "type": type_}]}}}}
    if headers:
        doc["headers"] = headers
    return doc


def text_route(responses: dict) -> dict:
    """The error answers of a route whose success is not JSON (``text/plain``, ``text/html``)."""
    return {code: {k: v for k, v in doc.items() if k != "model"} for code, doc in responses.items()}


def header_doc(description: str, example: str, required: bool = True) -> dict:
    return {"description": description, "required": required, "schema": {"type": "string"}, "example": example}


# The answers every /v1 route (and /metrics) may give besides its own; without ``model``, as some of these
# routes answer text or HTML (the components are registered by the JSON routes' errors).
AUTH_ERRORS = text_route({401: error_doc("Missing or unknown API key (only when PARAPLAN_API_KEYS is set).",
                              ["header", "Authorization"], "a valid API key is required (Authorization: Bearer KEY)",
                              "unauthorized",
                              headers={"WWW-Authenticate": header_doc("The scheme to use.", "Bearer")})})
# Any POST body (even of a route that reads none) is counted against PARAPLAN_MAX_BODY_BYTES.
TOO_LARGE = {413: error_doc("Request body larger than PARAPLAN_MAX_BODY_BYTES.", ["body"],
                            "the request body is larger than 1048576 bytes", "body_too_large")}
BODY_ERRORS = {
    **TOO_LARGE,
    422: error_doc("Bad input: the field and the reason.", ["body", "model"],
                   "unknown model preset 'nope'; known: deepseek-v3-671b, ...", "value_error"),
}
NOT_FOUND = {404: error_doc("No job with this id (well-formed or not).", ["path", "job_id"],
                            "no job with id 'd9b2d63d-a233-4123-847a-000000000000'", "not_found")}
QUERY_ERRORS = {422: error_doc("Bad query parameter.", ["query", "status"],
                               "Input should be 'queued', 'running', 'succeeded', 'failed' or 'cancelled'",
                               "enum")}
