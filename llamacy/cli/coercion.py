"""Command-line values without pydantic where the result is certain: a shortcut in front of typer's coercion.

typer 0.29 coerces every parameter's value through a pydantic TypeAdapter, built on first use for each of
a command's parameters, including those left at their default. For `llamacy run`'s 22 parameters that (with
importing pydantic for it) was the largest part of start-up after numpy. Most values need no such machinery:
None, a default of the annotated type, a str for a str option, a plain decimal for an int or float option,
strings for a list[str] option. For those the shortcut returns what typer's coercer returns (the same value
and type; tests/test_startup.py compares the two on many inputs); anything else, including every value that
is an error, goes to typer's own coercer, built on first need, so messages and edge cases stay typer's.

Only typer versions with per-parameter runtime coercion (`_runtime_param`, 0.29) get the shortcut; with
others FastCommand and FastGroup are plain TyperCommand and TyperGroup.
"""

from __future__ import annotations

import re
from typing import Any

from typer.core import TyperCommand, TyperGroup

_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,17})?")
_MISS = object()
_OTHER = object()  # the annotation of parameters whose values the shortcut leaves alone
_SCALARS = (str, int, float, bool)


def shortcut(annotation: Any, multi: bool, value: Any) -> Any:
    """The coerced value when it is certain without typer's coercer, else _MISS."""
    if value is None:
        return () if multi else None
    kind = type(value)
    if multi:
        if annotation == list[str] and kind in (tuple, list) and all(type(v) is str for v in value):
            return list(value)
        return _MISS
    if kind is annotation and kind in _SCALARS:
        return value
    if kind is str:
        if annotation is int and _INT.fullmatch(value):
            return int(value)
        if annotation is float and _FLOAT.fullmatch(value):
            return float(value)
    return _MISS


class _Coercion:
    """Stands in for typer's RuntimeParam of one parameter (only `coerce` is ever called on it)."""

    __slots__ = ("_annotation", "_full", "_multi")

    def __init__(self, annotation: Any, multi: bool) -> None:
        self._annotation = annotation
        self._multi = multi
        self._full: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        result = shortcut(self._annotation, self._multi, value)
        if result is not _MISS:
            return result
        if self._full is None:
            from typer._coercion import build_runtime_param

            self._full = build_runtime_param(param.type_descriptor)
        return self._full.coerce(value, param=param, ctx=ctx)


def _coercion(param: Any) -> _Coercion | None:
    """The stand-in for one parameter, or None when this typer has no per-parameter coercer to replace.
    None skips any coercer (typer's RuntimeParam.coerce returns it before looking at the type); other
    values take the shortcut only for plain str, int, float, bool and list[str] parameters."""
    try:
        if param._runtime_param is not None:
            return None
        desc = param.type_descriptor
        info = desc.parameter_info
        multi = bool(param.multiple or param.nargs == -1)
        annotation = desc.annotation
        plain = not (
            desc.file_annotation is not None
            or desc.is_path
            or desc.is_choice
            or info.parser is not None
            or info.min is not None
            or info.max is not None
            or getattr(info, "click_type", None) is not None
        )
    except AttributeError:  # another typer: no per-parameter runtime coercion to stand in for
        return None
    if not (plain and (annotation == list[str]) == multi and (multi or annotation in _SCALARS)):
        annotation = _OTHER  # matches no value's type: only None takes the shortcut
    return _Coercion(annotation, multi)


class _FastParams:
    """Puts the shortcut on a command's parameters, the help option (made on first need) included."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            coercion = _coercion(param)
            if coercion is not None:
                param._runtime_param = coercion
        return params


class FastCommand(_FastParams, TyperCommand):
    """A TyperCommand whose parameters' plain values skip the pydantic coercers (see the module doc)."""


class FastGroup(_FastParams, TyperGroup):
    """A TyperGroup (the root command) whose parameters' plain values skip the pydantic coercers."""
