"""Cluster profiles shipped with ParaPlan (YAML beside this file) and their calibrated factors.

``load`` takes a profile name, a path to a YAML/JSON file, or a dict (which may start from a shipped
profile with ``"base"``), merges the fitted factors of ``calibration/<name>.json`` (or of the profile
named by ``calibrate_from``) over the priors, and returns a validated ``ClusterProfile``.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import yaml

from costmodel.spec import ClusterProfile

HERE = Path(__file__).parent
CALIBRATION_DIR = HERE / "calibration"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class ProfileNotFound(LookupError):
    pass


def names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def raw(name: str) -> dict:
    path = HERE / f"{name}.yaml"
    if not path.is_file():
        raise ProfileNotFound(f"unknown cluster profile {name!r}; known: {', '.join(names())}")
    return yaml.safe_load(path.read_text())


def calibration(name: str) -> dict | None:
    """The fitted factors of profile ``name`` (``calibration/<name>.json``), None when it has none. ``name``
    is a profile's name, never a path: a name with a separator or ``..`` (``calibrate_from`` in a profile
    someone else wrote) would read any ``.json`` file the process can, so it is refused."""
    if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name) or ".." in name:
        raise ProfileNotFound(f"calibrate_from must name a cluster profile (letters, digits, '.', '_', '-'), "
                              f"not a path; known: {', '.join(names())}")
    path = CALIBRATION_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _apply_calibration(data: dict) -> dict:
    source_name = data.get("calibrate_from") or data["name"]
    cal = calibration(source_name)
    if not cal:
        return data
    data = copy.deepcopy(data)
    for key, value in cal["factors"].items():
        if key in data.get("efficiency", {}):
            prior = data["efficiency"][key]
            data["efficiency"][key] = {
                "value": value,
                "source": f"calibrated by {cal.get('script', 'scripts/calibrate.py')} on "
                          f"{len(cal.get('fitted_on', []))} published {source_name} runs "
                          f"(prior {prior.get('value')}: {prior.get('source', '')})",
                "confidence": "medium"}
    data["calibration"] = {k: cal[k] for k in ("fitted_on", "precisions", "moe", "max_devices") if k in cal}
    return data


def load_data(spec: str | dict) -> dict:
    """The merged profile as plain data (name, path, or dict with optional ``base``)."""
    if isinstance(spec, dict):
        spec = dict(spec)
        base = spec.pop("base", None)
        if not base:
            return _apply_calibration(spec) if "efficiency" in spec else spec
        # the base's calibrated factors first, then the user's overrides on top of them
        data = _merge(_apply_calibration(raw(base)), spec)
        if "name" not in spec:
            data["name"] = f"{base}+overrides"
        return data
    path = Path(spec)
    if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        return load_data(data) if isinstance(data, dict) and "base" in data else _apply_calibration(data)
    return _apply_calibration(raw(spec))


def load(spec: str | dict) -> ClusterProfile:
    return ClusterProfile.model_validate(load_data(spec))
