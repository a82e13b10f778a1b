"""Which way imports point between the launcher's rooms (docs/launcher.md): read from the source, so a module that
imports a room above its own fails here before it makes a circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "llmtrain"
# What each room may import of llmtrain.launch besides itself, and whether it may import anything else of llmtrain.
LAUNCH_ALLOWED = {
    "launch/supervision": (),
    # The backends' traits import nothing of llmtrain: the node agent reads where a backend keeps the node rank.
    # A start's shape on fewer nodes: read by the node room (a Slurm start) and the backends.
    "launch/shape": ("llmtrain.launch.backends.traits", "llmtrain.launch.preflight", "llmtrain.launch.launch_record"),
    "launch/node": ("llmtrain.launch.supervision", "llmtrain.launch.run_lock", "llmtrain.launch.launch_record",
                    "llmtrain.launch.goodput_entry", "llmtrain.launch.backends.traits", "llmtrain.launch.shape"),
    "launch/backends": ("llmtrain.launch.node", "llmtrain.launch.supervision", "llmtrain.launch.container",
                        "llmtrain.launch.hostfile", "llmtrain.launch.preflight", "llmtrain.launch.shape"),
}


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update([node.module] + [f"{node.module}.{a.name}" for a in node.names])
    return {n for n in names if n.startswith("llmtrain")}


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("room", sorted(LAUNCH_ALLOWED))
def test_a_room_imports_only_rooms_below_it(room):
    own = "llmtrain." + room.replace("/", ".")
    allowed = (own, *LAUNCH_ALLOWED[room])
    wrong = {f"{path.name}: {name}" for path in (PACKAGE / room).glob("*.py") for name in imported(path)
             if name.startswith("llmtrain.launch") and name != "llmtrain.launch" and not _under(name, allowed)}
    assert not wrong, sorted(wrong)


def test_the_slurm_client_imports_nothing_of_llmtrain_but_itself():
    wrong = {f"{p.name}: {n}" for p in (PACKAGE / "slurm").glob("*.py") for n in imported(p)
             if not _under(n, ("llmtrain.slurm",))}
    assert not wrong, sorted(wrong)


def test_only_the_command_line_sweeps_and_tune_import_the_launch_entry():
    users = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
             if any(_under(n, ("llmtrain.launch.run",)) for n in imported(p))} - {"launch/run.py"}
    assert users == {"cli.py", "jobs/cancel.py", "sweep/launch_sweep.py", "tune/cli.py"}
