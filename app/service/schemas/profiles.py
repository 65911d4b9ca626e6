"""Measured runs and profile versions of a cluster (`/v1/clusters/{name}/measurements`, `.../versions`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.formats.bounds import MAX_DEVICES

from .jobs import MODEL_FIELD

# A refit scores every measurement once per candidate factor set: the service's cap on candidates is
# the setting PARAPLAN_MAX_CALIBRATION_EVALS (at most this), the CLI's --max-evals range the same.
MAX_FIT_EVALS = 100_000
MIN_FIT_EVALS = 10


class MeasurementIn(BaseModel):
    """One measured run, in the published-runs format (CONTRACT.md, "Published-runs file"). Other keys
    (`notes`, extra `reported` figures) are kept and ignored, as in the file."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [{
        "name": "llama3-70b-256npu-2026-12-01", "source": "our cluster, step 2000-2100 mean",
        "devices": 256, "model": "llama3-70b",
        "config": {"tp": 8, "pp": 8, "global_batch_size": 64, "overlap_grad_reduce": False},
        "reported": {"tokens_per_s_per_device": 212.5}}]})

    name: str = Field(min_length=1, max_length=200, description="The run's name (shown in the fit's figures).")
    source: str | None = Field(None, max_length=2000, description="Where the figure comes from.")
    cluster: str | None = Field(None, description="The cluster: the path's `{name}`, or omitted.")
    devices: int = Field(ge=1, le=MAX_DEVICES, description="Devices of the run.")
    model: str | dict[str, Any] = MODEL_FIELD
    config: dict[str, Any] = Field(description="The training config the run used (CONTRACT.md, \"Training "
                                               "config\").")
    reported: dict[str, Any] = Field(description="`tokens_per_s_per_device` (a positive number) is the figure "
                                                 "fitted; `mfu`, `tflops_per_device` are information.",
                                     examples=[{"tokens_per_s_per_device": 212.5}])


class MeasurementOut(BaseModel):
    id: str = Field(description="A UUID.")
    cluster: str
    created_at: dt.datetime
    run: dict[str, Any] = Field(description="The run as posted, `cluster` filled in.")


class MeasurementPage(BaseModel):
    items: list[MeasurementOut]
    total: int
    limit: int
    offset: int


class VersionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    max_evals: int | None = Field(None, ge=MIN_FIT_EVALS, le=MAX_FIT_EVALS,
                                  description="At most this many candidate factor sets scored (default and "
                                              "cap: PARAPLAN_MAX_CALIBRATION_EVALS).")


class FactorChange(BaseModel):
    before: float | None = Field(description="The factor in the shipped profile (the prior).")
    after: float = Field(description="The fitted factor.")


class RunError(BaseModel):
    name: str
    reported: float = Field(description="Measured tokens/s per device.")
    before: float = Field(description="predicted / reported - 1 with the shipped profile.")
    after: float = Field(description="predicted / reported - 1 with the fitted profile.")


class PublishedFigures(BaseModel):
    runs: int = Field(description="Published runs of this cluster scored.")
    mape_before: float
    mape_after: float


class VersionOut(BaseModel):
    """Version 0 is the shipped profile (no fit: its figures are null, its lists empty)."""

    cluster: str = Field(examples=["ascend-910b"])
    number: int = Field(description="1, 2, ... per API key and cluster; 0 = the shipped profile.", examples=[1])
    name: str = Field(description="What `cluster` names it in jobs and evaluates.", examples=["ascend-910b@1"])
    profile_version: str = Field(description="The profile's hash (`versions.profile` of every result on it).")
    created_at: dt.datetime | None
    measurement_ids: list[str] = Field(description="The measurements it was fitted on.")
    runs: int = Field(description="How many.")
    mape_before: float | None = Field(description="MAPE of tokens/s per device on those runs, shipped profile.")
    mape_after: float | None = Field(description="The same with the fitted profile.")
    published: PublishedFigures | None = Field(description="The published runs of the cluster before and after "
                                                           "(null when the service has none).")
    published_worse: bool = Field(description="The refit raised the published set's MAPE by more than 0.05: "
                                              "reported, not hidden.")
    factors: dict[str, FactorChange] = Field(description="Each fitted factor before and after.")
    run_errors: list[RunError] = Field(description="Each run's relative error before and after.")
    max_evals: int | None = Field(description="Candidate factor sets the fit could score.")


class VersionDetail(VersionOut):
    profile: dict[str, Any] = Field(description="The full profile (facts and factors, each with its source).")


class VersionList(BaseModel):
    items: list[VersionOut] = Field(description="Version 0 (shipped) first, then the caller's, oldest first.")
    total: int
