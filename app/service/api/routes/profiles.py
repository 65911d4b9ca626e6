"""`/v1/clusters/{name}/measurements` and `/v1/clusters/{name}/versions`: a team's measured runs of a
shipped cluster, and the profile versions refitted on them. Thin: the work is in
``app/service/services/profiles.py``. Database reads and writes run in the database threads with a
session closed there before the answer is sent (``db_route``); the refit runs there too, inside one of
the heavy turns that also bound deep evaluates."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from app.service.api.deps import api_scope, db_route, get_settings, in_db
from app.service.api.routes.evaluate import heavy_turn
from app.service.core.config import Settings
from app.service.schemas.common import (AUTH_ERRORS, BODY_ERRORS, MAX_OFFSET, MAX_PAGE_SIZE, QUERY_ERRORS, TOO_LARGE,
                                        error_doc, header_doc, text_route)
from app.service.schemas.profiles import (MeasurementIn, MeasurementOut, MeasurementPage, VersionCreate,
                                          VersionDetail, VersionList)
from app.service.services import profiles as service

router = APIRouter(prefix="/v1/clusters/{name}", tags=["calibration"], dependencies=[Depends(api_scope)],
                   responses=AUTH_ERRORS)

ClusterName = Annotated[str, Path(description="A shipped cluster profile (`GET /v1/clusters`).",
                                  examples=["ascend-910b"])]
MeasurementId = Annotated[str, Path(description="The measurement's UUID.")]
Number = Annotated[int, Path(ge=0, le=1_000_000_000, description="The version: 1, 2, ...; 0 = the shipped profile.")]

UNKNOWN_CLUSTER = error_doc("No shipped cluster profile by this name.", ["path", "name"],
                            "unknown cluster profile 'nope'; known: ascend-910b, ...", "not_found")
NO_MEASUREMENT = {404: error_doc("Unknown cluster, or no measurement with this id of this API key.",
                                 ["path", "measurement_id"], "no measurement '0b5c8c52-...' of ascend-910b",
                                 "not_found")}
NO_VERSION = {404: error_doc("Unknown cluster, or no version with this number of this API key.", ["path", "number"],
                             "no version 3 of ascend-910b", "not_found")}
BUSY = {503: error_doc("No heavy turn came free in time (shared with deep-pipeline evaluates; `Retry-After` says "
                       "when to retry).", ["path", "name"], "2 heavy requests (deep evaluates, profile refits) "
                       "are running and none ended within 30 s; retry later", "busy",
                       headers={"Retry-After": header_doc("Seconds to wait before retrying.", "5")})}


@router.post("/measurements", status_code=201, response_model=MeasurementOut, summary="Add a measured run",
             description="One run in the published-runs format (CONTRACT.md), measured on this cluster; validated "
                         "as a published run is, and scorable on the cluster (422 naming the field otherwise). "
                         "Owned by the API key that posts it.",
             responses={**BODY_ERRORS, 404: UNKNOWN_CLUSTER})
@db_route()
def add_measurement(name: ClusterName, body: MeasurementIn, scope: str = Depends(api_scope),
                    db: Session = None, settings: Settings = Depends(get_settings)) -> dict:
    service.check_cluster(name)
    run = service.checked_run(name, body.model_dump(mode="json", exclude_unset=True))
    return service.measurement_out(service.add_measurement(db, scope, name, run, settings.max_measurements))


@router.get("/measurements", response_model=MeasurementPage, summary="The caller's measured runs of this cluster",
            description="Oldest first.", responses={**QUERY_ERRORS, 404: UNKNOWN_CLUSTER})
@db_route()
def list_measurements(name: ClusterName, limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 50,
                      offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
                      scope: str = Depends(api_scope), db: Session = None) -> dict:
    service.check_cluster(name)
    rows, total = service.list_measurements(db, scope, name, limit, offset)
    return {"items": [service.measurement_out(r) for r in rows], "total": total, "limit": limit, "offset": offset}


@router.get("/measurements/{measurement_id}", response_model=MeasurementOut, summary="One measured run",
            responses=NO_MEASUREMENT)
@db_route()
def get_measurement(name: ClusterName, measurement_id: MeasurementId, scope: str = Depends(api_scope),
                    db: Session = None) -> dict:
    service.check_cluster(name)
    return service.measurement_out(service.get_measurement(db, scope, name, measurement_id))


@router.delete("/measurements/{measurement_id}", status_code=204, response_class=Response,
               summary="Delete a measured run", description="Versions fitted on it keep what they were fitted on.",
               responses=NO_MEASUREMENT)
@db_route()
def delete_measurement(name: ClusterName, measurement_id: MeasurementId, scope: str = Depends(api_scope),
                       db: Session = None) -> Response:
    service.check_cluster(name)
    service.delete_measurement(db, scope, name, measurement_id)
    return Response(status_code=204)


@router.post("/versions", status_code=201, response_model=VersionDetail, summary="Refit the profile on the "
                                                                                 "caller's measurements",
             description="Refits the shipped profile's efficiency factors on ALL of the caller's measurements of "
                         "this cluster with the project's fit (as `paraplan calibrate`) and stores the result as "
                         "the caller's next version (`\"cluster\": \"<name>@<number>\"` in jobs and evaluates). The "
                         "answer and the version carry the MAPE on those runs and on the published runs before and "
                         "after; `published_worse` says when the refit makes the published set much worse. Takes "
                         "seconds (one heavy turn).",
             responses={**TOO_LARGE, 404: UNKNOWN_CLUSTER, **BUSY,
                        422: error_doc("No measurements to fit on, or a bad `max_evals`.", ["path", "name"],
                                       "this API key has no measurements of ascend-910b to fit on; POST them to "
                                       "/v1/clusters/ascend-910b/measurements first", "no_measurements")})
async def create_version(name: ClusterName, request: Request,
                         body: Annotated[VersionCreate | None, Body()] = None,
                         scope: str = Depends(api_scope), settings: Settings = Depends(get_settings)) -> dict:
    service.check_cluster(name)
    max_evals = min((body.max_evals if body else None) or settings.max_calibration_evals,
                    settings.max_calibration_evals)
    async with heavy_turn(request.app, settings, ("path", "name"), "heavy requests (deep evaluates, profile refits)"):
        # the refit is CPU work of up to a minute (bounded by its evaluation caps), so no request bound here
        return await in_db(request, lambda db: service.version_out(service.create_version(
            db, scope, name, max_evals, settings.max_calibration_run_evals)), timeout_s=None)


@router.get("/versions", response_model=VersionList, summary="The cluster's profile versions",
            description="Version 0 (the shipped profile) and the caller's versions, oldest first, each with its fit's "
                        "figures (without the full profile: `GET .../versions/{number}`).",
            responses={404: UNKNOWN_CLUSTER})
@db_route()
def list_versions(name: ClusterName, scope: str = Depends(api_scope), db: Session = None) -> dict:
    service.check_cluster(name)
    items = service.list_versions(db, scope, name)
    return {"items": items, "total": len(items)}


@router.get("/versions/{number}", response_model=VersionDetail, summary="One profile version, with the full profile",
            responses={**NO_VERSION, **QUERY_ERRORS})
@db_route()
def get_version(name: ClusterName, number: Number, scope: str = Depends(api_scope),
                db: Session = None) -> dict:
    service.check_cluster(name)
    return service.get_version(db, scope, name, number)


@router.get("/versions/{number}/report", response_class=HTMLResponse, summary="The version's calibration report",
            description="One self-contained HTML page (Plotly inlined): predicted-vs-measured tokens/s per device of "
                        "the measurements before and after the fit, the y = x line, the factors before and after and "
                        "the published-set figures; as `paraplan calibrate --report`. 409 for version 0 (no fit).",
            responses={200: {"content": {"text/html": {}}, "description": "The report."},
                       **text_route({**NO_VERSION, 409: error_doc("Version 0 is the shipped profile: nothing was "
                                                                  "fitted.", ["path", "number"],
                                                                  "version 0 is the shipped profile", "no_fit")})})
@db_route()
def get_report(name: ClusterName, number: Number, scope: str = Depends(api_scope),
               db: Session = None) -> Response:
    from app.formats.calibration_report import render_calibration_report

    service.check_cluster(name)
    version = service.get_version(db, scope, name, number)
    return HTMLResponse(render_calibration_report(service.fit_report(version)))
