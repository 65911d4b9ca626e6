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


def error_doc(description: str, loc: list, msg: str, type_: str) -> dict:
    return {"model": ErrorResponse, "description": description,
            "content": {"application/json": {"example": {"detail": [{"loc": loc, "msg": msg, "type": type_}]}}}}


# The answers every /v1 route may give besides its own.
AUTH_ERRORS = {401: error_doc("Missing or unknown API key (only when PARAPLAN_API_KEYS is set).",
                              ["header", "Authorization"], "a valid API key is required (Authorization: Bearer KEY)",
                              "unauthorized")}
BODY_ERRORS = {
    413: error_doc("Request body larger than PARAPLAN_MAX_BODY_BYTES.", ["body"],
                   "the request body is larger than 1048576 bytes", "body_too_large"),
    422: error_doc("Bad input: the field and the reason.", ["body", "model"],
                   "unknown model preset 'nope'; known: deepseek-v3-671b, ...", "value_error"),
}
NOT_FOUND = {404: error_doc("No job with this id (well-formed or not).", ["path", "job_id"],
                            "no job with id 'd9b2d63d-a233-4123-847a-000000000000'", "not_found")}
QUERY_ERRORS = {422: error_doc("Bad query parameter.", ["query", "status"],
                               "Input should be 'queued', 'running', 'succeeded', 'failed' or 'cancelled'",
                               "enum")}
