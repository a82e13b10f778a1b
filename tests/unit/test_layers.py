"""The layer rule of docs/architecture.md: no module imports a package of a layer above its own.

Every module under llmtrain/ is parsed with ast; imports at module level and inside functions both count, those
under `if TYPE_CHECKING:` do not (they never run). Layers are named by top-level package or module (llmtrain.X),
so a file moving inside a package keeps its layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "llmtrain"

# From the ground up; names on one line form one layer and may import each other.
LAYERS = [
    # "" is the package root; config reads the model families' specs (model/family.py, torch-free)
    ("", "errors", "config", "configs", "model", "console", "closed_stdout", "extras", "slurm"),
    ("hardware", "rundir"),
    ("data",),
    ("parallel", "loss"),
    ("checkpoint", "plan"),
    ("inference",),
    ("train",),
    ("launch", "worker"),
    ("jobs",),
    ("sweep", "tune"),
    ("report",),
    ("doctor",),
    ("cli", "__main__"),
]
LAYER_OF = {name: level for level, names in enumerate(LAYERS) for name in names}
# Modules every layer may import: they import nothing of llmtrain, and neither do their packages' __init__ files,
# so no import can come back up from them. The backends' traits are facts that config validation reads.
READ_BY_EVERY_LAYER = ("llmtrain.launch.backends.traits",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def top_level(module: str) -> str:
    """llmtrain.X.Y -> X; the package root itself -> ""."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skipped


def imported_modules(path: Path) -> list[str]:
    """Every llmtrain module `path` imports, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped, here, found = _type_checking_blocks(tree), module_name(path), []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + (path.name == "__init__.py")]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "llmtrain":  # `from llmtrain import X`: X may be a package of its own layer
                found += [f"llmtrain.{alias.name}" if alias.name in LAYER_OF else "llmtrain" for alias in node.names]
            else:
                found.append(module)
    return [m for m in found if m == "llmtrain" or m.startswith("llmtrain.")]


def upward_imports() -> list[str]:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = module_name(path)
        own = LAYER_OF.get(top_level(here))
        if own is None:
            problems.append(f"{here}: llmtrain.{top_level(here)} is in no layer (add it to LAYERS and "
                            "docs/architecture.md)")
            continue
        for target in imported_modules(path):
            if target in READ_BY_EVERY_LAYER:
                continue
            other = LAYER_OF.get(top_level(target))
            if other is not None and other > own:
                problems.append(f"{here} -> {target} (layer {other} above layer {own})")
    return problems


def test_no_module_imports_a_layer_above_its_own():
    problems = upward_imports()
    assert not problems, "imports that point up:\n" + "\n".join(problems)


@pytest.mark.parametrize("module", READ_BY_EVERY_LAYER)
def test_a_module_every_layer_reads_imports_nothing_of_llmtrain(module):
    parts = module.split(".")
    packages = [PACKAGE.parent.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts))]
    for path in [*packages, PACKAGE.parent.joinpath(*parts).with_suffix(".py")]:
        assert imported_modules(path) == [], path


def test_every_module_is_parsed():
    assert len(list(PACKAGE.rglob("*.py"))) > 100
    assert "llmtrain.config.schema" in imported_modules(PACKAGE / "config" / "validate.py")


@pytest.mark.parametrize("source, expected", [
    ("from llmtrain.train.trainer import Trainer\n", ["llmtrain.train.trainer"]),
    ("def f():\n    import llmtrain.launch.run\n", ["llmtrain.launch.run"]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from llmtrain.cli import main\n", []),
    ("from . import schema\nfrom ..data import tokenfile\n", ["llmtrain.config", "llmtrain.data"]),
    ("from llmtrain import jobs, __version__\n", ["llmtrain.jobs", "llmtrain"]),
])
def test_imports_are_read_from_module_and_function_level(tmp_path, monkeypatch, source, expected):
    fake = PACKAGE / "config" / "probe.py"  # a path inside the package, so relative imports resolve
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source)
    assert imported_modules(fake) == expected


def test_an_upward_import_is_named_with_both_layers(monkeypatch):
    real = Path.read_text

    def with_upward_import(self, *args, **kwargs):
        text = real(self, *args, **kwargs)
        return text + "\nfrom llmtrain.cli import main\n" if self.name == "derived.py" else text

    monkeypatch.setattr(Path, "read_text", with_upward_import)
    cli_layer = LAYER_OF["cli"]
    assert f"llmtrain.config.derived -> llmtrain.cli (layer {cli_layer} above layer 0)" in upward_imports()
