"""Lazy public names for a package: each loads its module on first use (PEP 562)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose names live in ``exports``' modules.

    ``exports`` maps a public name to a module path (absolute, or relative to ``package``). A
    name that the module lacks but that is its last component (``errors`` -> ``.errors``) is the
    module itself.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        path = exports.get(name)
        if path is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(path, package)
        if hasattr(module, name) or module.__name__.rpartition(".")[2] != name:
            value = getattr(module, name)
        else:
            value = module
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
