"""An example folder's module (``examples/<name>/<module>.py``) imported as its users run it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType


def example_module(folder: Path, name: str) -> ModuleType:
    """``import name`` with ``folder`` on the import path for that import only."""
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))
