"""Validation shared by every config of the project: run, report and benchmark.

A mistake is a ``ConfigError`` whose message names the key, its value and the allowed
values. ``build_sections`` builds the run's sections and reports every invalid key at once;
``Errors`` collects the checks of a flat config (the report's, the benchmark's) the same way:
one line, ``; ``-separated, exit status 2 at the edge.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
from collections.abc import Mapping
from typing import Any


class ConfigError(ValueError):
    """A user-facing configuration mistake; the message names the key and allowed values."""


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise ``ConfigError`` naming ``key``, its value and the allowed values unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is invalid: allowed values are {allowed}")


# Sweep ids, run ids and model names: they become folder names, filter strings and registry
# names, so a value read back from MLflow can neither leave a folder nor break a quote.
SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")
SAFE_NAME_ALLOWED = "letters, digits, '.', '_' and '-' (not '.' or '..' alone)"


def is_safe_name(value: Any) -> bool:
    """``value`` is a non-empty string of ``[A-Za-z0-9._-]`` that is not ``.`` or ``..``."""
    return (isinstance(value, str) and SAFE_NAME.fullmatch(value) is not None
            and value not in (".", ".."))


def safe_name(key: str, value: Any) -> str:
    """``value`` if ``is_safe_name``, else a ``ConfigError`` naming ``key``."""
    require(is_safe_name(value), key, value, SAFE_NAME_ALLOWED)
    return value


def positive_int(key: str, value: Any) -> None:
    """``value`` is an integer >= 1 (not a bool)."""
    require(
        isinstance(value, int) and not isinstance(value, bool) and value >= 1,
        key,
        value,
        "an integer >= 1",
    )


def positive_float(key: str, value: Any) -> None:
    """``value`` is a finite number > 0 (not a bool)."""
    # Finite too: inf passes "> 0" but an inf lr or init_scale turns every step into nan/skip.
    require(
        isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf,
        key,
        value,
        "a finite number > 0",
    )


def optional_step(key: str, value: Any) -> None:
    """``value`` is null or a 1-based optimizer-step index."""
    require(
        value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
        key,
        value,
        "null or an optimizer step index >= 1",
    )


def joined(errors: list[str]) -> str:
    """One line for one or many mistakes: ``"3 invalid keys: a; b; c"``."""
    return errors[0] if len(errors) == 1 else f"{len(errors)} invalid keys: " + "; ".join(errors)


class Errors:
    """Collects every failed check of a config, then raises them together.

    Args:
        error: the ``ConfigError`` subclass to raise.
    """

    def __init__(self, error: type[ConfigError] = ConfigError) -> None:
        self.error = error
        self.items: list[str] = []

    def require(self, ok: bool, key: str, value: Any, allowed: str) -> None:
        """Record ``key`` as invalid unless ``ok`` (the message of ``require``)."""
        if not ok:
            self.items.append(f"{key}={value!r} is invalid: allowed values are {allowed}")

    def raise_if_any(self) -> None:
        """Raise one error listing every recorded mistake."""
        if self.items:
            raise self.error(joined(self.items))


def locate(path: str) -> Any:
    """The object at a dotted import path (``package.module.Class``), importing as needed.

    Like Hydra's ``_locate`` (which ``instantiate`` uses), without its error log lines.
    """
    parts = path.split(".")
    missing: ModuleNotFoundError | None = None  # the longest module path that is not there
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and not module_name.startswith(err.name):
                raise  # a module that exists failed to import one of its own dependencies
            missing = missing or err
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            if missing is not None:
                raise missing from None
            raise
        return obj
    return importlib.import_module(path)


def _section_errors(cls: type, key: str, values: Mapping[str, Any]) -> list[str]:
    """Every problem of one section: each unknown key, then each invalid value."""
    names = {f.name for f in dataclasses.fields(cls)}
    errors = [f"unknown key {key}.{k}: allowed keys are {', '.join(sorted(names))}"
              for k in sorted(set(values) - names)]
    # __post_init__ stops at the first bad value: record it, put the keys it names back to
    # their defaults and try again, until the section builds or an error names no key.
    remaining = {k: v for k, v in values.items() if k in names}
    while True:
        try:
            cls(**remaining)
            return errors
        except (ConfigError, TypeError) as err:
            msg = str(err)
            if msg in errors:
                return errors
            errors.append(msg)
            # Every key the message names goes back to its default (both sides of a check
            # across keys).
            culprits = [k for k in remaining if f"{key}.{k}=" in msg
                        or (k == "name" and f"{key}=" in msg)]
            if not culprits:
                return errors
            for k in culprits:
                remaining.pop(k)


def build_sections(schema: Mapping[str, type], cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Build every section of ``cfg`` named in ``schema``, reporting all mistakes at once.

    The one validation helper of run, report and benchmark configs: each invalid key and its
    allowed values end up in a single ``ConfigError`` (one line, ``; ``-separated).

    Args:
        schema: section name -> frozen dataclass validating it.
        cfg: the plain mapping holding the sections (missing ones take the defaults).

    Returns:
        Section name -> constructed dataclass.

    Raises:
        ConfigError: listing every invalid key.
    """
    built, errors = {}, []
    for key, cls in schema.items():
        values = cfg.get(key) or {}
        if not isinstance(values, Mapping):
            errors.append(f"{key}={values!r} is invalid: allowed values are a mapping of keys")
            continue
        problems = _section_errors(cls, key, values)
        if problems:
            errors.extend(problems)
        else:
            built[key] = cls(**values)
    if errors:
        raise ConfigError(joined(errors))
    return built
