"""The one error type of bad user input, in a module of its own so that every reader of user input
(``inputs.py``, ``hf_config.py``, ...) imports it from here and none has to import another for it (with
the type in one of them, ``hf_config`` and ``inputs`` imported each other)."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: ``field`` names where, the message says why."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


# pydantic's bound checks: on a NaN or infinite input their message ("Input should be less than or equal to
# 64") names a bound the value does not miss; what is wrong is that it is not a number at all.
_BOUND_TYPES = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"}
_BOUND_WORDS = {"gt": "above", "ge": "at least", "lt": "below", "le": "at most"}


def validation_message(err: dict) -> str:
    """A pydantic error's message as the user reads it: without the "Value error, " that pydantic puts before
    a validator's own words, and "must be a finite number ..." for a NaN or infinite number."""
    import math

    value = err.get("input")
    if err.get("type") in _BOUND_TYPES and isinstance(value, float) and not math.isfinite(value):
        bounds = [f"{_BOUND_WORDS[k]} {v:g}" for k, v in (err.get("ctx") or {}).items() if k in _BOUND_WORDS]
        return "must be a finite number" + (f" ({' and '.join(bounds)})" if bounds else "") + f", not {value}"
    msg = str(err.get("msg", ""))
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return msg
