"""A launch script (or argument list) read into ParaPlan's inputs: ``read_launch(text)`` runs the bash reader
(``launch_script``) and the flag table's import (``search.frameworks.importer``) and turns their errors into
``InputError`` naming the flag (the CLI's exit 2, the API's 422); ``imported_json`` is the contract's form.
"""

from __future__ import annotations

from search.frameworks.importer import Imported, LaunchImportError, read_args

from .errors import InputError
from .launch_script import ScriptError, read_script

# Modelling inputs a launch does not state: the caller's (``--moe-load-imbalance``), never the script's
MODELLING_FIELDS = ("moe_load_imbalance", "moe_expert_load", "moe_expert_skew")


def read_launch(text: str, framework: str | None = None, devices: int | None = None,
                field: str = "launch") -> Imported:
    """The model, config, framework and devices of a launch script or argument list (``InputError``
    naming ``field`` and the flag or line on anything it cannot read)."""
    try:
        launch = read_script(text)
    except ScriptError as exc:
        raise InputError(field, str(exc)) from None
    _check_bounds(launch.args, field)
    try:
        imported = read_args(launch.args, framework, launcher=launch.launcher, entry=launch.entry)
    except LaunchImportError as exc:
        raise InputError(f"{field}.{exc.flag}" if field else exc.flag, exc.reason) from None
    except (ValueError, ArithmeticError, RecursionError) as exc:  # a combination the model cannot build
        raise InputError(field, f"the arguments do not build a config the cost model can read ({exc})") from None
    from .inputs import load_config, load_model

    # the same bounds as a spec or config given as a file (app/formats/bounds.py)
    imported.spec = load_model(imported.spec.model_dump(exclude_none=True))
    imported.config = load_config(imported.config.model_dump(exclude_defaults=True))
    imported.notes = launch.notes + imported.notes
    imported.devices = devices or launch.devices
    return imported


def _check_bounds(tokens: list[str], field: str) -> None:
    """The same bounds as a spec or config given as a file (app/formats/bounds.py), checked on the flags
    before anything is built from them (a pp of 10^11 would allocate its stages first)."""
    from search.frameworks import flags as table

    from .bounds import CONFIG_CAPS, MAX_LAYERS, SPEC_CAPS

    caps = {**{f: SPEC_CAPS[n] for f, n in table.SPEC_INT.items() if n in SPEC_CAPS},
            **{f: CONFIG_CAPS[n] for f, n in table.CONFIG_INT.items() if n in CONFIG_CAPS},
            "--num-layers-per-virtual-pipeline-stage": MAX_LAYERS, "--num-virtual-stages-per-pipeline-rank": MAX_LAYERS,
            "--padded-vocab-size": SPEC_CAPS.get("vocab_size", MAX_LAYERS), "--vocab-size": SPEC_CAPS.get("vocab_size", MAX_LAYERS)}
    for i, tok in enumerate(tokens):
        name, eq, val = tok.partition("=")
        if name not in caps:
            continue
        val = val if eq else (tokens[i + 1] if i + 1 < len(tokens) else "")
        if val.isdigit() and int(val) > caps[name]:
            raise InputError(f"{field}.{name}", f"at most {caps[name]:,} (got {int(val):,})")


def read_launch_file(path: str, framework: str | None = None, devices: int | None = None) -> Imported:
    """``read_launch`` of a file, or of stdin for ``-``."""
    import sys

    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as exc:
        raise InputError("launch", f"cannot read {path!r} ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise InputError("launch", f"{path!r} is not UTF-8 text") from None
    return read_launch(text, framework, devices)


def imported_json(imp: Imported) -> dict:
    """The import as JSON: framework, devices (null when the launcher does not state them), the model spec and
    the training config (only the fields that differ from their defaults), notes and warnings."""
    return {"framework": imp.framework, "devices": imp.devices,
            "model": imp.spec.model_dump(mode="json", exclude_none=True),
            "config": imp.config.model_dump(mode="json", exclude_defaults=True),
            "notes": imp.notes, "warnings": imp.warnings}
