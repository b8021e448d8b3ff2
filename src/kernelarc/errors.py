"""User-facing errors: the CLI prints these as one clear message, without a traceback."""

from __future__ import annotations


class KernelArcError(Exception):
    """An error the user can act on; the message says what is wrong and what to do."""


class ProblemLoadError(KernelArcError):
    """A problem, workload or solution file does not load. Names the file, line and field."""

    def __init__(
        self, file: str, message: str, *, line: int | None = None, field: str | None = None
    ) -> None:
        self.file, self.line, self.field, self.message = file, line, field, message
        where = file + (f":{line}" if line is not None else "")
        what = f" (field {field})" if field else ""
        super().__init__(f"{where}{what}: {message}")


class InputGenerationError(KernelArcError):
    """Inputs of a workload cannot be produced; the message names problem, workload, input."""


class MissingBlobError(InputGenerationError):
    """A workload reads a safetensors file that is not on disk."""
