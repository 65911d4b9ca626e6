"""Turning user input (preset names, files, inline JSON, dicts) into validated cost-model objects.

Every failure is an ``InputError`` whose message names the field and the reason; callers turn it into
a CLI message with exit code 2 (or an HTTP 422).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from pydantic import ValidationError

import hardware_profiles
import model_presets
from costmodel import ClusterProfile, ModelSpec, TrainingConfig, routing

from .bounds import MAX_DEVICES, SPEC_CAPS, config_problems, int_problem, layout_problem
from .errors import InputError, validation_message  # noqa: F401 - InputError re-exported: callers catch app.formats.inputs.InputError


def _where(err: dict, prefix: str) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    return f"{prefix}.{loc}" if loc else prefix


def describe_validation_error(exc: ValidationError, prefix: str, errors: list[dict] | None = None) -> str:
    """``field: reason`` of each error (of ``errors`` when given, else all of ``exc``'s), joined by "; "."""
    return "; ".join(f"{_where(err, prefix)}: {validation_message(err)}"
                     for err in (exc.errors() if errors is None else errors))


def _validated(cls, data, prefix: str):
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        first, *others = exc.errors()
        reason = validation_message(first)
        if others:  # the first error is the message's own; the rest follow, each once
            reason += f" (and {len(others)} more: {describe_validation_error(exc, prefix, others)})"
        raise InputError(_where(first, prefix), reason) from None


def yaml_problem(exc: yaml.YAMLError, source: str) -> str:
    """A YAML parse error in one line that names ``source`` (the file, or "inline text"), where PyYAML's own
    message names the parsed text "<unicode string>" and spreads over several lines with carets."""
    def at(mark) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""

    if not isinstance(exc, yaml.MarkedYAMLError):
        return f"{source} is not valid YAML ({' '.join(str(exc).split())})"
    what = exc.problem or "cannot be parsed"
    where = f" at {at(exc.problem_mark)}" if exc.problem_mark is not None else ""
    context = f" ({exc.context} at {at(exc.context_mark)})" if exc.context and exc.context_mark is not None else (
        f" ({exc.context})" if exc.context else "")
    return f"{source} is not valid YAML: {what}{where}{context}"


def read_mapping(text_or_path: str, field: str) -> dict:
    """A JSON/YAML object given inline or as a file path.

    A value that opens with ``{`` is inline JSON whatever its length (never tried as a path: a long
    one would fail with the system's file-name limit); anything else is a file that must exist."""
    try:
        if text_or_path.lstrip().startswith("{"):
            data = json.loads(text_or_path)
        else:
            path = Path(text_or_path)
            if not path.exists():
                raise InputError(field, f"file {text_or_path!r} does not exist")
            text = path.read_text()
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise InputError(field, f"not valid JSON ({exc})") from None
    except yaml.YAMLError as exc:
        raise InputError(field, yaml_problem(exc, repr(text_or_path))) from None
    except OSError as exc:
        raise InputError(field, f"cannot read {text_or_path!r} ({exc.strerror})") from None
    if not isinstance(data, dict):
        raise InputError(field, "must be a JSON object (or a file holding one)")
    return data


def _missing_file(value, field: str) -> None:
    """A name that can only be a file path (a directory part or a data-file suffix) and names no file
    is reported as a missing file, not as an unknown preset."""
    if not isinstance(value, str) or value.lstrip().startswith("{"):
        return
    path = Path(value)
    if ("/" in value or path.suffix in (".yaml", ".yml", ".json")) and not path.exists():
        raise InputError(field, f"file {value!r} does not exist")


def load_model(model: str | dict, seq_length: int | None = None) -> ModelSpec:
    if isinstance(model, str) and model.lstrip().startswith("{"):
        model = read_mapping(model, "model")  # inline JSON spec
    from .hf_config import maybe_hf  # a Hugging Face config.json (path or mapping) becomes spec fields

    model = maybe_hf(model, seq_length)
    data = _catalog_data(model_presets.spec_data, model_presets.PresetNotFound, model, "model")
    if seq_length is not None:
        data["seq_length"] = seq_length
    spec = _validated(ModelSpec, data, "model")
    for key, cap in SPEC_CAPS.items():  # app/formats/bounds.py: the same bounds for files, inline JSON and the API
        v = getattr(spec, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > cap:
            raise InputError(f"model.{key}", f"{v} is beyond any real model (at most {cap:,})")
    return spec


def load_cluster(cluster: str | dict) -> ClusterProfile:
    from .results import refuse_degenerate

    data = _catalog_data(hardware_profiles.load_data, hardware_profiles.ProfileNotFound, cluster, "cluster")
    profile = _validated(ClusterProfile, data, "cluster")
    refuse_degenerate(profile)  # before any arithmetic overflows on it
    return profile


def _catalog_data(load, not_found: type[Exception], value, field: str) -> dict:
    """``load(value)`` (a preset or profile name, a path or a mapping) with its failures as an InputError
    naming ``field``: an unknown name says which ones exist, a bad file why it cannot be read."""
    _missing_file(value, field)
    try:
        return load(value)
    except not_found as exc:
        raise InputError(field, str(exc).strip('"')) from None
    except yaml.YAMLError as exc:
        raise InputError(field, yaml_problem(exc, repr(value) if isinstance(value, str) else "the text")) from None
    except (OSError, ValueError) as exc:
        raise InputError(field, str(exc)) from None


def check_config_data(data: dict, prefix: str = "config") -> None:
    """A config mapping's integers and pipeline_layout within the bounds of ``app/formats/bounds.py``."""
    for key, reason in config_problems(data):
        raise InputError(f"{prefix}.{key}", reason)
    if (problem := layout_problem(data.get("pipeline_layout"))) is not None:
        raise InputError(f"{prefix}.pipeline_layout", problem)


def load_config(config: str | dict) -> TrainingConfig:
    data = read_mapping(config, "config") if isinstance(config, str) else config
    if isinstance(data, dict):
        check_config_data(data)
    return _validated(TrainingConfig, data, "config")


def check_config_for_model(spec: ModelSpec, config: TrainingConfig, prefix: str = "config") -> None:
    """What a config states about the model's experts fits the model (costmodel/routing.py)."""
    if (problem := routing.routing_problem(spec, config)) is not None:
        raise InputError(f"{prefix}.{problem[0]}", problem[1])


def check_devices(devices: int) -> int:
    if devices <= 0:
        raise InputError("devices", "must be a positive number of devices")
    if (problem := int_problem(devices, MAX_DEVICES)) is not None:
        raise InputError("devices", problem)
    return devices
