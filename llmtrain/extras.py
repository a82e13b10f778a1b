"""Optional extras (pyproject's optional-dependencies): whether the package an extra installs is here, looked up
without importing it, so the launcher can refuse a config that needs it before anything starts."""

from __future__ import annotations

from importlib.util import find_spec


def missing_extra(package: str) -> str | None:
    """Why `package` (installed by the extra of the same name) cannot be used here, or None."""
    if find_spec(package) is None:
        return (f"needs the {package} package, which is not installed: pip install 'llmtrain[{package}]' "
                f"(in a checkout: pip install -e '.[{package}]')")
    return None
