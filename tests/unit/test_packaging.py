"""Every package llmtrain imports is declared in pyproject.toml, so a fresh `pip install -e .` runs it."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Import name -> distribution name, where they differ.
DISTRIBUTIONS = {"hydra": "hydra-core", "liger_kernel": "liger-kernel"}
# Optional and not on PyPI: built from source by users, refused with a one-line hint when missing.
BUILT_BY_USERS = {"apex"}


def _requirements(specs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].lower() for spec in specs}


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _third_party_imports() -> dict[str, set[str]]:
    """{'module': top-level third-party imports, 'function': those imported inside functions} over llmtrain/."""
    found = {"module": set(), "function": set()}
    for path in (REPO / "llmtrain").rglob("*.py"):
        tree = ast.parse(path.read_text())
        at_module_level = {id(node) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))}
        for func in ast.walk(tree):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                at_module_level -= {id(n) for n in ast.walk(func) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("llmtrain", "__future__"):
                    continue
                found["module" if id(node) in at_module_level else "function"].add(top)
    return found


def test_every_runtime_import_is_declared():
    project = _pyproject()["project"]
    required = _requirements(project["dependencies"])
    optional = set().union(*(_requirements(specs) for specs in project["optional-dependencies"].values()))
    imports = _third_party_imports()
    missing = {m for m in imports["module"] if DISTRIBUTIONS.get(m, m) not in required}
    assert not missing, f"imported at module level but not in [project] dependencies: {sorted(missing)}"
    undeclared = {m for m in imports["function"] - BUILT_BY_USERS if DISTRIBUTIONS.get(m, m) not in required | optional}
    assert not undeclared, f"imported on demand but in no dependency list or extra: {sorted(undeclared)}"


def test_numpy_is_a_dependency():
    # torch does not depend on numpy, but torch.distributed's object collectives (used by every checkpoint save)
    # fail without it: "RuntimeError: Numpy is not available".
    assert "numpy" in _requirements(_pyproject()["project"]["dependencies"])


def test_tensorboard_is_an_extra_that_the_tests_install():
    # torch.utils.tensorboard (logging.tensorboard, llmtrain report --tensorboard) imports the tensorboard package,
    # which torch does not depend on; the scan above sees only the torch import.
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    assert "tensorboard" in _requirements(extras["tensorboard"])
    assert "tensorboard" in _requirements(extras["test"])
    assert "tensorboard" not in _requirements(project["dependencies"])


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_tracker_is_an_extra_that_the_tests_install(tracker):
    # logging.wandb / logging.mlflow name this extra when the package is missing; CI installs it through `test`.
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    assert tracker in _requirements(extras[tracker])
    assert tracker in _requirements(extras["test"])
    assert tracker not in _requirements(project["dependencies"])
