"""Package namespaces whose names load their modules on first use (PEP 562).

``import vidsight`` and the command line's parser must not pull in torch and transformers: a
probe or a flag error would then cost seconds. Each package lists where its public names live.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable


def lazy_exports(package: str, modules: dict[str, tuple[str, ...]]
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` for ``package``, each public name loaded from its module.

    A public name that is also a submodule's name (``vidsight.ingest.probe``, the function in
    ``vidsight/ingest/probe.py``) stays the function: importing the submodule binds the package
    attribute to the module, and the package takes the function from it instead.

    Args:
        package: The package's ``__name__``.
        modules: Each defining module -> the public names it gives the package.
    """
    exports = {name: source for source, names in modules.items() for name in names}
    module = sys.modules[package]
    namespace = module.__dict__

    class _Package(types.ModuleType):
        def __setattr__(self, name: str, value: object) -> None:
            if name in exports and isinstance(value, types.ModuleType) and value.__name__ == f"{package}.{name}":
                value = getattr(value, name)
            super().__setattr__(name, value)

    module.__class__ = _Package

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value  # later look-ups skip this hook
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__, sorted(exports)
