"""Errors a user may see. Each carries a one-line message; the CLI prints it and exits non-zero."""

from __future__ import annotations


class LlamacyError(Exception):
    """An error with a message meant for the user, not a traceback."""

    exit_code: int = 1


class UsageError(LlamacyError):
    """Bad options or input: the user can fix the command line."""

    exit_code = 2


class ContextOverflowError(UsageError):
    """A prompt (or a conversation) longer than the context window."""


class GGUFError(LlamacyError):
    """A file that is not a valid GGUF file (or cannot be read at all); llamacy.gguf raises it."""


class UnsupportedModelError(LlamacyError):
    """A valid GGUF file that this engine cannot run (architecture, tokenizer or tensor type)."""


class CPUError(LlamacyError):
    """The CPU lacks an instruction set the kernels were built for."""


def require_range(name: str, value: float, lo: float, hi: float | None = None) -> None:
    """UsageError unless lo <= value (<= hi): the one wording of every numeric option's bounds."""
    if hi is None and value < lo:
        raise UsageError(f"{name} must be at least {lo}, got {value}")
    if hi is not None and not lo <= value <= hi:
        raise UsageError(f"{name} must be between {lo} and {hi}, got {value}")
