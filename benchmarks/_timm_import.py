"""Import ``timm`` without a working ``torchvision`` (or Pillow): shared by the torch tools.

``import timm`` imports ``timm.data`` (transforms, datasets) and ``timm.layers``, which import
torchvision (and Pillow, which normally comes with it) at module level. The ViT models, their
forward and backward passes and ``_load_weights`` use neither, and the PyPI torchvision does not
load on this project's machines, so timm is installed with ``--no-deps`` and a *missing* package
is replaced by stub modules before ``import timm``: any submodule can be imported, any attribute
is an inert, subclassable placeholder class whose attributes are again distinct placeholders
(timm builds lookup tables keyed by e.g. ``InterpolationMode.BILINEAR`` at import time), and
``__version__`` is "0.0.0" (timm parses Pillow's). Installed packages are never stubbed.

    timm = _timm_import.import_timm()      # raises TorchMissingError if torch or timm is absent
    _timm_import.stubbed_packages()        # e.g. ["torchvision"]

Used by ``benchmarks/torch_step.py`` and ``tests/make_timm_fixture.py`` (with ``benchmarks/`` on
``sys.path``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

REQUIRED = ("torch", "timm")
STUBBABLE = ("torchvision", "PIL")

_stubbed: list[str] = []


class TorchMissingError(ImportError):
    """torch and/or timm are not installed; `missing` names them."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = list(missing)
        super().__init__(f"not installed: {', '.join(self.missing)}")


def _placeholder(name: str) -> type:
    return _PlaceholderMeta(name, (_Placeholder,), {})


class _PlaceholderMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        attr = _placeholder(f"{cls.__name__}.{name}")
        setattr(cls, name, attr)  # cached: the same attribute is the same object
        return attr


class _Placeholder(metaclass=_PlaceholderMeta):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves stub modules for every module under the given top-level package names."""

    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # default module creation

    def exec_module(self, module: types.ModuleType) -> None:
        placeholders: dict[str, type] = {}

        def module_getattr(name: str) -> type:
            if name.startswith("__"):
                raise AttributeError(name)
            return placeholders.setdefault(name, _placeholder(name))

        module.__version__ = "0.0.0"  # type: ignore[attr-defined]
        module.__getattr__ = module_getattr  # type: ignore[method-assign]


def missing_packages(names: tuple[str, ...] = REQUIRED) -> list[str]:
    """Those of `names` that cannot be imported (not installed)."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def stub_missing_packages(names: tuple[str, ...] = STUBBABLE) -> list[str]:
    """Install stubs for those of `names` that are not importable; return all stubbed names.

    Idempotent: a package is stubbed at most once per process.
    """
    new = [name for name in missing_packages(names) if name not in _stubbed]
    if new:
        sys.meta_path.append(_StubFinder(set(new)))
        _stubbed.extend(new)
    return list(_stubbed)


def stubbed_packages() -> list[str]:
    """The packages this process serves from stubs."""
    return list(_stubbed)


def import_timm() -> types.ModuleType:
    """`import timm` (and so torch), stubbing torchvision/Pillow first when they are missing.

    Raises `TorchMissingError` (an ImportError) naming torch and/or timm when not installed.
    """
    missing = missing_packages()
    if missing:
        raise TorchMissingError(missing)
    stub_missing_packages()
    import timm

    return timm
