"""The shape of the code base, kept by tests: modules stay small and import each other without cycles.

Every import counts, including those deferred into functions and those under TYPE_CHECKING: a cycle hidden
by a deferred import still means two modules that cannot be understood or changed one at a time.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "llamacy"
MAX_LINES = 600
SOURCES = sorted(p for ext in ("*.py", "*.pyx", "*.pxi") for p in PKG.rglob(ext))
# Cython: `from a.b cimport x`, `cimport a.b`, `from a.b import x`, `import a.b`.
_CY_IMPORT = re.compile(r"^\s*(?:from\s+(llamacy[\w.]*)\s+c?import|c?import\s+(llamacy[\w.]*))", re.M)


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in SOURCES}


def resolve(name: str) -> str | None:
    """The llamacy module an imported name lives in (a name imported from a package may be a module)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(path: Path, me: str) -> set[str]:
    text = path.read_text()
    found: set[str] = set()
    if path.suffix == ".py":
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
    else:
        found.update(m.group(1) or m.group(2) for m in _CY_IMPORT.finditer(text))
    targets = {resolve(n) for n in found if n.startswith("llamacy")}
    # A package importing its own submodules is how a package exposes them, not a cycle between peers.
    return {t for t in targets if t and t != me and not t.startswith(me + ".")}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_sources_found():
    assert len(SOURCES) > 50 and "llamacy.engine" in MODULES and "llamacy.model.forward" in MODULES


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PKG)))
def test_module_is_small(path: Path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(PKG)} has {n} lines (at most {MAX_LINES}): split it by concern"


def test_no_import_cycles():
    graph = {name: imports_of(path, name) for name, path in MODULES.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_deferred_and_type_checking_imports_count(tmp_path: Path):
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from llamacy.engine import Llama\n"
        "def f():\n    from llamacy.model import memory\n"
    )
    # Importing a submodule runs its package too.
    assert imports_of(src, "outside") == {"llamacy.engine", "llamacy.model", "llamacy.model.memory"}
