"""Load kubernetes_asyncio's generated client lazily, so the agent stays small.

``import kubernetes_asyncio`` executes ``client/__init__.py``, ``client/api/__init__.py`` and
``client/models/__init__.py``, which import every API group and all ~770 model classes: about
60 MiB of resident memory, most of the agent's footprint, for the handful of calls an agent makes.
``install()`` registers those three packages beforehand as modules whose attributes are imported
on first use (PEP 562 ``__getattr__``), using the same name -> module table their ``__init__``
files spell out, so every ``from kubernetes_asyncio.client import X`` still resolves to the same
object. Only the agent's command line calls it, before anything imports kubernetes_asyncio.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

logger = logging.getLogger(__name__)

ROOT: Final = "kubernetes_asyncio"
PACKAGES: Final = (f"{ROOT}.client", f"{ROOT}.client.api", f"{ROOT}.client.models")
_FROM_IMPORT = re.compile(r"^from\s+(kubernetes_asyncio\.client[\w.]*)\s+import\s+(\w+)\s*$", re.MULTILINE)
_VERSION = re.compile(r'^__version__\s*=\s*"([^"]+)"', re.MULTILINE)


def _lazy_getattr(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    def load(attr: str) -> Any:
        target = names.get(attr)
        if target is not None:
            value = getattr(importlib.import_module(target), attr)
        else:
            try:
                value = importlib.import_module(f"{package}.{attr}")
            except ModuleNotFoundError:
                raise AttributeError(f"module {package!r} has no attribute {attr!r}") from None
        setattr(sys.modules[package], attr, value)
        return value

    return load


def install() -> bool:
    """Register the lazy packages; False (and nothing changed) if kubernetes_asyncio is loaded already."""
    if any(name in sys.modules for name in (ROOT, *PACKAGES)):
        return False
    spec = importlib.util.find_spec(ROOT)
    if spec is None or spec.origin is None:
        return False
    base = Path(spec.origin).parent
    modules: dict[str, types.ModuleType] = {}
    for name in PACKAGES:
        folder = base.joinpath(*name.split(".")[1:])
        init = folder / "__init__.py"
        source = init.read_text(encoding="utf-8")
        names = {attr: module for module, attr in _FROM_IMPORT.findall(source)}
        if not names:
            return False  # an unexpected layout: leave the package to load normally
        module = types.ModuleType(name)
        module.__file__ = str(init)
        module.__path__ = [str(folder)]
        module.__package__ = name
        module_spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module_spec.submodule_search_locations = [str(folder)]
        module.__spec__ = module_spec
        version = _VERSION.search(source)
        if version:
            module.__version__ = version.group(1)  # type: ignore[attr-defined]
        module.__getattr__ = _lazy_getattr(name, names)  # type: ignore[method-assign]
        modules[name] = module
    sys.modules.update(modules)
    # The import system binds a submodule to its parent only when it loads it; these are preset.
    client = modules[f"{ROOT}.client"]
    client.api = modules[f"{ROOT}.client.api"]  # type: ignore[attr-defined]
    client.models = modules[f"{ROOT}.client.models"]  # type: ignore[attr-defined]
    return True
