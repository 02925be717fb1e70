"""gguf-py's name tables (architectures, tensor kinds, tensor names) without the rest of that package.

    from llamacy.gguf_names import MODEL_TENSOR as T, TENSOR_NAMES

The tables live in gguf/constants.py, but `import gguf` runs the package's __init__, which also imports its
reader, writer, vocabulary and metadata modules and PyYAML: 40 ms of a 0.3 s `llamacy run` on a small model,
for code only `convert` uses. Here constants.py is loaded alone, under its own name `gguf.constants`: a later
`import gguf` (the converter) finds it in sys.modules and builds on that one module, so every enum member
stays one object whoever imported it first. A submodule put in sys.modules that way is not an attribute of
the package imported after it, so a one-shot finder hangs it there (`gguf.constants.X` works as usual).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def _constants() -> ModuleType:
    loaded = sys.modules.get("gguf.constants")
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("gguf")  # finds the package without running its __init__
    if package is None or not package.submodule_search_locations:
        raise ImportError("the gguf package is not installed (pip install 'gguf>=0.19')")
    path = Path(next(iter(package.submodule_search_locations))) / "constants.py"
    spec = importlib.util.spec_from_file_location("gguf.constants", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gguf.constants"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["gguf.constants"]
        raise
    return module


class _AttachConstants(importlib.abc.MetaPathFinder):
    """Finds `gguf` once, the usual way, and sets gguf.constants before the package's __init__ runs."""

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "gguf":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_package = spec.loader.exec_module  # type: ignore[attr-defined]

        def exec_module(module: ModuleType) -> None:
            module.constants = sys.modules["gguf.constants"]  # type: ignore[attr-defined]
            exec_package(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_c = _constants()
if "gguf" not in sys.modules:
    sys.meta_path.insert(0, _AttachConstants())
MODEL_ARCH = _c.MODEL_ARCH
MODEL_TENSOR = _c.MODEL_TENSOR
MODEL_TENSORS = _c.MODEL_TENSORS
TENSOR_NAMES = _c.TENSOR_NAMES
LlamaFileType = _c.LlamaFileType
del _c

__all__ = [
    "MODEL_ARCH",
    "MODEL_TENSOR",
    "MODEL_TENSORS",
    "TENSOR_NAMES",
    "LlamaFileType",
]
