"""``VersionGate``: the range of a dependency's versions whose internals a compat module read."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import metadata

log = logging.getLogger(__name__)
_warned: set[VersionGate] = set()  # each untested version is said once per process


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version string (``"2.13.0+cpu"`` -> ``(2, 13, 0)``).

    A pre- or development release counts as its release (``"4.0.0rc1"`` -> ``(4, 0, 0)``), so
    it is outside a range that ends below it.

    Raises:
        ValueError: the string does not start with a number.
    """
    found = re.match(r"\d+(?:\.\d+)*", version.strip())
    if found is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in found.group().split("."))


def _padded(v: tuple[int, ...], n: int) -> tuple[int, ...]:
    return v + (0,) * (n - len(v))


@dataclass(frozen=True)
class VersionGate:
    """The tested versions of one dependency: ``low <= version < below``.

    Args:
        package: the distribution name (``importlib.metadata``).
        low: the first tested version (inclusive).
        below: the first version not tested (exclusive).
        module: the compat module behind this gate (named in the warning).
        reads: the internals that module reaches into (named in the warning).
    """

    package: str
    low: str
    below: str
    module: str
    reads: str

    @property
    def spec(self) -> str:
        """The range as a requirement specifier (``>=2.13,<2.14``)."""
        return f">={self.low},<{self.below}"

    def installed(self) -> str | None:
        """The installed version (None: not installed)."""
        try:
            return metadata.version(self.package)
        except metadata.PackageNotFoundError:
            return None

    def admits(self, version: str) -> bool:
        """Whether ``version`` is inside the tested range."""
        v, lo, hi = release(version), release(self.low), release(self.below)
        n = max(len(v), len(lo), len(hi))
        return _padded(lo, n) <= _padded(v, n) < _padded(hi, n)

    def why_not(self, version: str | None = None) -> str | None:
        """One line saying why ``version`` (the installed one by default) is untested; None
        when it is inside the range."""
        version = self.installed() if version is None else version
        if version is not None and self.admits(version):
            return None
        return (f"{self.package} {version or '(not installed)'} is outside {self.spec}, the "
                f"range {self.module} was tested with; it reads {self.reads}")

    def check(self) -> bool:
        """Whether the installed version is tested; logs ``why_not`` once per process if not."""
        reason = self.why_not()
        if reason is not None and self not in _warned:
            _warned.add(self)
            log.warning("%s", reason)
        return reason is None
