"""Run a function on a module right after it is first imported: the one import hook that
the image's per-interpreter line (disttrain.pth) installs, shared by guard.py and
progress.py.

`after_import(name, patch)` registers `patch(module)` for the module `name`; the finder
finds nothing itself: for a registered name it lets the normal finders find the module,
then calls each patch right after the module's code has run. A patch that fails with
AttributeError (another release without the names it patches) is skipped silently.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Callable

_PATCHES: dict[str, list[Callable]] = {}


def after_import(name: str, patch: Callable) -> None:
    patches = _PATCHES.setdefault(name, [])
    if patch in patches:                 # installed twice: patch once
        return
    patches.append(patch)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    module = sys.modules.get(name)
    if module is not None:               # imported before the hook: patch it now
        _apply(patch, module)


def _apply(patch: Callable, module) -> None:
    try:
        patch(module)
    except AttributeError:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patches = _PATCHES.get(name)
        if not patches:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for patch in patches:
                _apply(patch, module)

        spec.loader.exec_module = exec_module
        return spec
