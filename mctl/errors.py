"""Domain errors and the exit codes they map to.

Library code raises these with text written for an operator; the CLI's single
error boundary prints them and exits with the code. Nothing below the CLI prints
or exits.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3
EXIT_INTERNAL = 70          # an unexpected exception: a bug in mctl (sysexits' EX_SOFTWARE); traceback with -v


class MctlError(Exception):
    """An error an operator can act on: a message, an optional hint, an exit code."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class UsageError(MctlError):
    """Bad input from the command line or a file: exit 2, nothing changed."""


class InventoryError(UsageError):
    """The inventory cannot be loaded or does not validate."""

    def __init__(self, problems: list["Problem"], source: str):
        self.problems = problems
        self.source = source
        first = problems[0].render() if problems else "invalid inventory"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(first + more, hint=f"run 'mctl -i {source} inventory validate' for every problem")


class PartialFailure(MctlError):
    """Some hosts or steps failed while others succeeded: exit 3."""

    exit_code = EXIT_PARTIAL


class EnvironmentProblem(MctlError):
    """A prerequisite on this machine is missing (a program, root, a kernel feature)."""


class Problem:
    """One validation problem, located in a file."""

    __slots__ = ("file", "line", "field", "message", "hint")

    def __init__(self, file: str, line: int | None, field: str, message: str, hint: str | None = None):
        self.file = file
        self.line = line
        self.field = field
        self.message = message
        self.hint = hint

    def render(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        return text

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "field": self.field,
                "message": self.message, "hint": self.hint}
