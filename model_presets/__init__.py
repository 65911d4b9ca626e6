"""Model presets shipped with ParaPlan (YAML beside this file, each field with its source).

``load`` takes a preset name, a path to a YAML/JSON spec, or a dict (which may start from a preset
with ``"base"`` and override any field) and returns a validated ``ModelSpec``.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from costmodel.spec import ModelSpec

HERE = Path(__file__).parent
INFO_KEYS = ("source", "sources", "notes")  # documentation, not spec fields


class PresetNotFound(LookupError):
    pass


def names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def raw(name: str) -> dict:
    """The preset file as written, sources included."""
    path = HERE / f"{name}.yaml"
    if not path.is_file():
        raise PresetNotFound(f"unknown model preset {name!r}; known: {', '.join(names())}")
    return yaml.safe_load(path.read_text())


def spec_data(spec: str | dict) -> dict:
    """The spec fields (no source keys) of a name, a file path or a dict with optional ``base``."""
    if isinstance(spec, dict):
        data = {k: v for k, v in spec.items() if k not in INFO_KEYS}
        base = data.pop("base", None)
        if base is not None:
            merged = spec_data(base)
            merged.update(data)
            return merged
        return data
    path = Path(spec)
    if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
        text = path.read_text()
        loaded = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        if not isinstance(loaded, dict):
            raise ValueError(f"{spec}: a model spec must be a mapping of fields")
        return spec_data(loaded)
    return {k: v for k, v in raw(spec).items() if k not in INFO_KEYS}


def load(spec: str | dict) -> ModelSpec:
    return ModelSpec.model_validate(spec_data(spec))
