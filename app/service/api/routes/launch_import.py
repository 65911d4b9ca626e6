"""`POST /v1/launch/import` (a launch script read back, as `paraplan import`) and `POST /v1/compare` (two
configs part by part with the causes, as `paraplan compare`): thin routes over app/formats."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from app.formats.compare import compare, side
from app.formats.errors import InputError
from app.formats.launch_import import imported_json, read_launch
from app.service.api.deps import api_scope
from app.service.schemas.common import AUTH_ERRORS, BODY_ERRORS
from app.service.schemas.launch_import import CompareRequest, CompareSide, Imported, ImportRequest
from app.service.services.errors import field_loc, invalid
from app.service.services.inputs import (check_config_for, check_stages, resolve_cluster, resolve_config,
                                         resolve_model)

router = APIRouter(prefix="/v1", tags=["launch"], dependencies=[Depends(api_scope)], responses=AUTH_ERRORS)


@router.post("/launch/import", response_model=Imported, summary="Read a launch script into a model and a config",
             description="The inverse of the launch export (docs/guides/import-compare.md): a Megatron-LM or MindSpeed-LLM launch "
                         "script or argument list read into a model spec and a training config. 422 naming the flag "
                         "(`loc` `[\"body\", \"text\", \"--flag\"]`) for an unknown or refused flag, a flag without "
                         "its value, contradictory flags or a script that cannot be read.",
             responses=BODY_ERRORS)
def import_launch(body: ImportRequest) -> dict:
    try:
        return imported_json(read_launch(body.text, body.framework, field="text"))
    except InputError as exc:
        raise invalid(field_loc(exc.field), exc.reason) from None


def _side(s: CompareSide, name: str, profile):
    loc = f"{name}"
    if s.launch is not None:
        if s.model is not None or s.config is not None:
            raise invalid(["body", name], "give launch, or model and config, not both")
        try:
            imp = read_launch(s.launch, s.framework, s.devices, field=f"{loc}.launch")
        except InputError as exc:
            raise invalid(field_loc(exc.field), exc.reason) from None
        if imp.devices is None:
            raise invalid(["body", name, "devices"], "the script does not state nodes × processes: give devices")
        spec, cfg, devices = imp.spec, imp.config, imp.devices
    else:
        if s.model is None or s.config is None or s.devices is None:
            raise invalid(["body", name], "give launch, or model, config and devices")
        spec = resolve_model(s.model, None)
        check_stages(spec, s.config.get("pp"), s.config.get("vpp"), ["body", name, "config"])
        cfg = resolve_config(s.config)
        check_config_for(spec, cfg)
        devices = s.devices
    try:
        return side(s.label or name.upper(), spec, cfg, devices, profile)
    except Exception as exc:  # noqa: BLE001 - input the cost model cannot score is still the caller's input
        raise invalid(["body", name], f"cannot be evaluated ({type(exc).__name__}: {exc})") from None


@router.post("/compare", summary="Compare two configs part by part, with the causes",
             description="Both evaluations side by side (every time and memory part), the difference B − A of "
                         "each, and each difference's cause in the cost model's terms, ordered by size "
                         "(docs/guides/import-compare.md). Each side is a launch script or a model, config and devices.",
             responses=BODY_ERRORS)
def compare_route(body: CompareRequest) -> dict:
    profile = resolve_cluster(body.cluster)
    a, b = _side(body.a, "a", profile), _side(body.b, "b", profile)
    try:
        return compare(a, b)
    except Exception as exc:  # noqa: BLE001 - a mixed config on the way from A to B the model cannot score
        raise invalid(["body"], f"cannot be compared ({type(exc).__name__}: {exc})") from None
