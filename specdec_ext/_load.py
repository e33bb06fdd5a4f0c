"""Loading the compiled ops (``specdec_ext._C``) with an error that says what went wrong.

Two failures look alike from Python ("cannot import name '_C' ... most likely due to a
circular import") and need different fixes:

- the ``specdec_ext`` that Python found has no ``_C`` library at all. Almost always this is
  the source folder of a checkout shadowing the installed package: after
  ``pip install .`` the library lives in site-packages, but running from the repository
  root puts the checkout's ``specdec_ext/`` (no ``_C``) first on ``sys.path``;
- ``_C`` is there but cannot be loaded (typically built against another torch: undefined
  symbols).

:func:`load` raises an :class:`ImportError` naming the folder, the installed copy it hides
when there is one, and the fix.
"""
from __future__ import annotations

import glob
import importlib
import importlib.machinery
import os
import sys
from typing import Optional

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _library_files(package_dir: str) -> list:
    """The ``_C`` extension files in ``package_dir`` (any ABI suffix this Python loads)."""
    return [f for suffix in importlib.machinery.EXTENSION_SUFFIXES
            for f in glob.glob(os.path.join(package_dir, "_C" + suffix))]


def _other_install(package_dir: str) -> Optional[str]:
    """Another ``specdec_ext`` folder on sys.path that holds a built ``_C`` (the copy the
    source folder hides), or None."""
    here = os.path.normcase(os.path.realpath(package_dir))
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), "specdec_ext")
        if os.path.normcase(os.path.realpath(candidate)) != here and _library_files(candidate):
            return candidate
    return None


def _built_against() -> str:
    """' (built against torch X, running Y)' from the build record, or ''."""
    try:
        from . import _build_info
    except ImportError:
        return ""
    import torch

    built = getattr(_build_info, "TORCH_VERSION", None)
    return f" (built against torch {built}, running torch {torch.__version__})" if built else ""


def missing_message(package_dir: str = PACKAGE_DIR) -> str:
    """Why there is no ``_C`` in ``package_dir`` and what to do (one paragraph)."""
    other = _other_install(package_dir)
    if other is not None:
        return (f"specdec_ext's compiled ops (_C) are not in {package_dir}: Python imported that folder (a source "
                f"checkout, first on sys.path, e.g. the current directory) instead of the installed specdec_ext in "
                f"{other}. Run from another directory, or install in place so the checkout itself has _C: "
                f"pip install --no-build-isolation -e .  (or: python setup.py build_ext --inplace)")
    return (f"specdec_ext's compiled ops (_C) are not in {package_dir}: the package is not built. From a source "
            f"checkout: pip install --no-build-isolation -e .  (or: python setup.py build_ext --inplace); "
            f"if specdec_ext is installed elsewhere, run from another directory so this folder does not shadow it")


def load():
    """Import and return ``specdec_ext._C`` (registers ``torch.ops.specdec.*``); an
    ImportError that says why and what to do when it cannot."""
    try:
        return importlib.import_module("._C", __package__)
    except ImportError as e:
        if not _library_files(PACKAGE_DIR):
            raise ImportError(missing_message()) from None
        raise ImportError(f"specdec_ext's compiled ops (_C) in {PACKAGE_DIR} failed to load{_built_against()}: {e}. "
                          f"Rebuild against the torch you run: pip install --no-build-isolation -e .  "
                          f"(or reinstall with pip install --no-build-isolation .)") from e


_C = load()
