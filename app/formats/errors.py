"""The one error type of bad user input, in a module of its own so that every reader of user input
(``inputs.py``, ``hf_config.py``, ...) imports it from here and none has to import another for it (issue 15:
``hf_config`` and ``inputs`` used to import each other)."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: ``field`` names where, the message says why."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
