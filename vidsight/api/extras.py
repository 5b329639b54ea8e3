"""Commands that need an optional extra say which one, instead of failing on an import.

The extras' packages are read from vidsight's own installed metadata (pyproject.toml's
``[project.optional-dependencies]``), so the lists live in one place.
"""

from __future__ import annotations

import importlib.metadata
import re

from vidsight.errors import ConfigError

DISTRIBUTION = "vidsight"
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[([^\]]*)\])?")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def extra_packages(extra: str) -> list[str]:
    """The distributions ``pip install 'vidsight[extra]'`` adds, other extras it names included.

    Empty when vidsight runs from a source tree that was never installed (no metadata to read).
    """
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    packages: list[str] = []
    for requirement in requirements:
        marker = _EXTRA.search(requirement)
        name = _NAME.match(requirement)
        if marker is None or marker.group(1) != extra or name is None:
            continue
        if name.group(1) == DISTRIBUTION:   # vidsight[serve] inside another extra
            for inner in (name.group(2) or "").split(","):
                packages += extra_packages(inner.strip())
        else:
            packages.append(name.group(1))
    return packages


def missing_packages(extra: str) -> list[str]:
    missing = []
    for package in extra_packages(extra):
        try:
            importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            missing.append(package)
    return missing


def require_extra(extra: str, what: str) -> None:
    """Raise a `ConfigError` naming ``extra`` when any of its packages is not installed.

    Args:
        extra: The extra's name in pyproject.toml (``serve``, ``ray``, ``eval``).
        what: What needs it, for the message (``vidsight serve``).
    """
    missing = missing_packages(extra)
    if missing:
        raise ConfigError(f"{what} needs the {extra} extra ({', '.join(missing)} not installed): "
                          f"pip install 'vidsight[{extra}]'")
