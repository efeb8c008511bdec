"""The exception types that reach users as a message (exit status 2), never as a traceback, and the one warning."""

from __future__ import annotations

#: A bad value longer than this is shown cut, so the error stays one line.
VALUE_CHARS = 80


class MemfracError(Exception):
    """A problem with the user's input or environment, phrased so the user can fix it."""


def show_value(value: object) -> str:
    """The bad value as the message shows it: repr, on one line, cut to VALUE_CHARS."""
    text = repr(value).replace("\n", "\\n")
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


def one_line(text: str) -> str:
    """A file name or field as the message shows it: characters that would break the line escaped."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


class FieldError(MemfracError):
    """One field of one file (or command-line option) is wrong: names the file, the field, the bad value and
    what is allowed, on one line. `field` may be empty when the whole file is the problem."""

    def __init__(self, file: object, field: str, value: object, allowed: str, hint: str = "") -> None:
        self.file, self.field, self.value, self.allowed = str(file), field, value, allowed
        where = f"{one_line(self.file)}: {one_line(field)}" if field else one_line(self.file)
        msg = f"{where}: bad value {show_value(value)}; allowed: {allowed}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class ScenarioError(FieldError):
    """A scenario file that does not validate: names the file, the key, the bad value and what is allowed."""

    def __init__(self, file: str, key: str, value: object, allowed: str, hint: str = "") -> None:
        super().__init__(file, f"key '{key}'", value, allowed, hint)
        self.key = key


class MemfracWarning(UserWarning):
    """Something memfrac kept going past (a truncated log: what was read is kept); shown as one line."""
