"""The one exception type that reaches users as a message (exit status 2), never as a traceback."""

from __future__ import annotations


class MemfracError(Exception):
    """A problem with the user's input or environment, phrased so the user can fix it."""


class ScenarioError(MemfracError):
    """A scenario file that does not validate: names the file, the key, the bad value and what is allowed."""

    def __init__(self, file: str, key: str, value: object, allowed: str, hint: str = "") -> None:
        self.file, self.key, self.value, self.allowed = file, key, value, allowed
        msg = f"{file}: key '{key}': bad value {value!r}; allowed: {allowed}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)
