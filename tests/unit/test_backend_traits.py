"""Backends are told apart by their traits (llmtrain/launch/backends/traits.py), not by their names: outside
launch/backends/ only the files listed here compare or collect a backend's name, and each trait changes what its
readers do (jobs, sweeps, containers, the node agent, doctor, preflight)."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.fake_run import make_run
from helpers.job_records import OK, launch_entry

from llmtrain.config.errors import ConfigError
from llmtrain.config.schema_choice import choices_of
from llmtrain.config.schema_cluster import ClusterConfig
from llmtrain.launch.backends import registry
from llmtrain.launch.backends.traits import BACKEND_NAMES, TRAITS, known_traits, traits_of

PACKAGE = Path(__file__).resolve().parents[2] / "llmtrain"
# The files outside launch/backends/ that compare or collect a backend's name (at most 3). A file that starts to
# fails test_only_the_listed_files_name_a_backend with its name and lines: read the backend's traits instead.
NAMING_A_BACKEND: set[str] = set()


def backend_names_used(source: str) -> list[int]:
    """The lines where a string equal to a backend's name is compared, collected in a tuple, list, set or dict
    literal, or used as a subscript. Message text ("Slurm job 12") and call arguments are not counted."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            candidates = [node.left, *node.comparators]
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            candidates = node.elts
        elif isinstance(node, ast.Dict):
            candidates = [*node.keys, *node.values]
        elif isinstance(node, ast.Subscript):
            candidates = [node.slice]
        else:
            continue
        lines.update(c.lineno for c in candidates if isinstance(c, ast.Constant) and c.value in BACKEND_NAMES)
    return sorted(lines)


def files_naming_a_backend() -> dict[str, list[int]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("launch/backends/"):
            continue
        lines = backend_names_used(path.read_text())
        if lines:
            found[relative] = lines
    return found


def test_the_scan_finds_a_backend_name_wherever_it_looks():
    source = ('a == "slurm"\n'
              'b in ("local", "x")\n'
              'c = ["ssh"]\n'
              'd = {"ssh"}\n'
              'e = {"pyxis": ("slurm",)}\n'
              'f = g["local"]\n'
              'say("Slurm job 12")\n'
              'choice("local", *NAMES)\n'
              'h = "ssh"\n'
              'i == "slurmd"\n')
    assert backend_names_used(source) == [1, 2, 3, 4, 5, 6]


def test_only_the_listed_files_name_a_backend():
    found = files_naming_a_backend()
    assert len(NAMING_A_BACKEND) <= 3
    assert set(found) == NAMING_A_BACKEND, f"files naming a backend (file: lines): {found}"


# ---- the seam ----------------------------------------------------------------------------------------------------
def test_every_registered_backend_class_carries_its_traits():
    assert tuple(registry.BACKENDS) == BACKEND_NAMES == ("local", "ssh", "slurm")
    seen = []
    for name, (module, class_name) in registry.BACKENDS.items():
        cls = getattr(importlib.import_module(module), class_name)
        assert cls.traits is TRAITS[name]
        backend = object.__new__(cls)  # name and owns_processes come from the traits, not from __init__
        seen.append((backend.name, backend.owns_processes, backend.traits.queued))
    assert seen == [("local", True, False), ("ssh", True, False), ("slurm", False, True)]


def test_the_schema_offers_every_backend():
    assert ClusterConfig().name == "local"
    assert choices_of(ClusterConfig, "name") == ("local", "ssh", "slurm")


def test_an_unknown_name_has_no_traits():
    assert known_traits("ssh") is TRAITS["ssh"]
    assert known_traits("kubernetes") is None and known_traits(None) is None
    with pytest.raises(KeyError):
        traits_of("kubernetes")


def _with(monkeypatch, name: str, **changed) -> None:
    """Backend `name` with other traits: what follows must change with them, whatever the name."""
    monkeypatch.setitem(TRAITS, name, dataclasses.replace(TRAITS[name], **changed))


# ---- jobs: a launch record's backend, by owns_processes ----------------------------------------------------------
@pytest.mark.parametrize("backend,owned", [("local", True), ("ssh", True), ("slurm", False), ("kubernetes", False),
                                           (None, False)])
def test_a_launcher_owns_the_processes_when_its_backend_does(backend, owned):
    from llmtrain.jobs.job_state import launcher_owned

    assert launcher_owned(backend) is owned


@pytest.mark.parametrize("backend,owns,killed", [("local", None, True), ("slurm", None, False),
                                                 ("kubernetes", None, False), ("slurm", True, True),
                                                 ("local", False, False)])
def test_cancel_now_kills_leftovers_only_for_a_backend_that_owns_processes(tmp_path, capsys, monkeypatch, backend,
                                                                         owns, killed):
    from llmtrain.jobs.cancel import run_cancel
    from llmtrain.launch.supervision import processes

    if owns is not None:
        _with(monkeypatch, backend, owns_processes=owns)
    calls = []
    monkeypatch.setattr(processes, "kill_all", lambda run_dir: calls.append(run_dir) or 2)
    run_dir = make_run(tmp_path, statuses={0: OK}, launches=[launch_entry(backend=backend)])
    assert run_cancel(SimpleNamespace(run_dir=str(run_dir), now=True)) == 0
    out, err = capsys.readouterr()
    assert not err
    assert calls == ([str(run_dir)] if killed else [])
    assert out == (f"llmtrain: nothing to cancel: no job runs in {run_dir} (finished: all 1 rank(s) finished)"
                   + ("; killed 2 leftover process(es) of it on this node" if killed else "") + "\n")


@pytest.mark.parametrize("backend,said", [("local", "exit 0 (finished)"), ("slurm", "exit 0"),
                                          ("kubernetes", "exit 0")])
def test_status_says_what_a_launcher_exit_means_only_for_an_owning_backend(backend, said):
    from llmtrain.jobs.status import _launch_line

    assert _launch_line(launch_entry(2, backend=backend)) == f"2: 2025-01-01 10:00:00 {backend}, {said}"


@pytest.mark.parametrize("backend,state", [("local", "interrupted"), ("kubernetes", "finished")])
def test_a_job_whose_launcher_did_not_record_its_end_was_killed_only_if_it_owned_it(tmp_path, backend, state):
    from llmtrain.jobs.job_state import job_state

    run_dir = make_run(tmp_path, statuses={0: OK}, launches=[launch_entry(backend=backend, exit_code=None,
                                                                           ended=None)])
    assert job_state(str(run_dir)).state == state


# ---- sweeps: queued -----------------------------------------------------------------------------------------------
def _plan(backend: str) -> SimpleNamespace:
    return SimpleNamespace(name="s", dir="/tmp/sweeps/s", runs=[], swept_keys=[], backend=backend)


@pytest.mark.parametrize("backend,queued,said", [
    ("local", None, "the runs start one after another"),
    ("slurm", None, "each run is submitted as its own Slurm job, all at once"),
    ("local", True, "each run is submitted as its own Slurm job, all at once"),
    ("slurm", False, "the runs start one after another"),
])
def test_sweep_preview_says_how_the_runs_start_by_queued(capsys, monkeypatch, backend, queued, said):
    from llmtrain.sweep.preview import dry_run

    if queued is not None:
        _with(monkeypatch, backend, queued=queued)
    assert dry_run(_plan(backend)) == 0
    assert f"llmtrain: cluster={backend}: {said}\n" in capsys.readouterr().out


@pytest.mark.parametrize("backend,queued,state", [("local", None, "finished"), ("slurm", None, "submitted"),
                                                  ("ssh", True, "submitted"), ("slurm", False, "finished")])
def test_a_sweep_run_that_launched_well_is_submitted_when_queued(capsys, monkeypatch, backend, queued, state):
    import llmtrain.launch.run
    from llmtrain.sweep import launch_sweep

    if queued is not None:
        _with(monkeypatch, backend, queued=queued)
    monkeypatch.setattr(launch_sweep, "skip_reason", lambda cfg: None)
    monkeypatch.setattr(launch_sweep, "_recorded_as_single_launch", lambda plan, run: contextlib.nullcontext())
    monkeypatch.setattr(llmtrain.launch.run, "launch", lambda cfg: 0)
    plan = _plan(backend)
    run = SimpleNamespace(name="r0", cfg=None)
    plan.runs = [run]
    assert launch_sweep.run_one(plan, run, 1).state == state


# ---- containers: container_runtimes -------------------------------------------------------------------------------
def _container_cfg(*overrides: str):
    from llmtrain.config import compose_config

    return compose_config(["device=cpu", *overrides])


@pytest.mark.parametrize("overrides,message", [
    (["cluster.container.runtime=pyxis"],
     "pyxis works with cluster=slurm, not cluster=local (it is a Slurm plugin: srun starts the container)"),
    (["cluster.container.runtime=apptainer"], "apptainer works with cluster=slurm or cluster=ssh, not cluster=local"),
    (["cluster=ssh", "cluster.hostfile=h", "cluster.nproc_per_node=2", "cluster.container.runtime=pyxis"],
     "pyxis works with cluster=slurm, not cluster=ssh (it is a Slurm plugin: srun starts the container)"),
])
def test_a_runtime_the_backend_lacks_is_refused_in_one_line(overrides, message):
    from llmtrain.launch.container import check_container

    with pytest.raises(ConfigError) as e:
        check_container(_container_cfg(*overrides))
    assert str(e.value) == f"cluster.container.runtime: {message}"


def test_a_runtime_the_traits_list_is_taken(monkeypatch):
    from llmtrain.launch.container import backends_for, check_container

    _with(monkeypatch, "local", container_runtimes=("apptainer",))
    assert backends_for("apptainer") == ["local", "slurm", "ssh"] and backends_for("pyxis") == ["slurm"]
    with pytest.raises(ConfigError) as e:  # past the runtime's rule: the next one, the image
        check_container(_container_cfg("cluster.container.runtime=apptainer"))
    assert e.value.key == "cluster.container.image"


# ---- the node agent: node_rank_env ----------------------------------------------------------------------------------
def test_the_node_agent_reads_the_node_rank_where_the_backend_keeps_it(monkeypatch):
    from llmtrain.launch.node.agent import node_rank_of

    monkeypatch.setenv("SLURM_NODEID", "2")
    monkeypatch.setenv("OTHER_NODE_RANK", "5")
    assert node_rank_of("3") == 3 and node_rank_of("slurm") == 2
    _with(monkeypatch, "slurm", node_rank_env="OTHER_NODE_RANK")
    assert node_rank_of("slurm") == 5
    with pytest.raises(ValueError):  # a backend without one: the launcher passes the number
        node_rank_of("ssh")


# ---- doctor: probes_hosts, lists_node_states ------------------------------------------------------------------------
@pytest.mark.parametrize("backend,changed,asked", [("local", {}, None), ("ssh", {}, "hosts"), ("slurm", {}, "nodes"),
                                                   ("local", {"probes_hosts": True}, "hosts"),
                                                   ("ssh", {"probes_hosts": False}, None)])
def test_doctor_checks_the_nodes_the_way_the_backend_can(monkeypatch, backend, changed, asked):
    from llmtrain.doctor import node_availability

    _with(monkeypatch, backend, **changed)
    calls = []
    monkeypatch.setattr(node_availability, "ssh_hosts_ready", lambda cfg, console: calls.append("hosts") or False)
    monkeypatch.setattr(node_availability, "slurm_nodes_ready", lambda cfg, console: calls.append("nodes") or False)
    ready = node_availability.nodes_ready(SimpleNamespace(cluster=SimpleNamespace(name=backend)), None)
    assert calls == ([asked] if asked else []) and ready is (asked is None)


# ---- preflight and config: launcher_is_the_node, uses_hostfile ------------------------------------------------------
def test_memory_is_compared_only_where_the_launcher_is_the_node(monkeypatch):
    from llmtrain.launch import preflight

    monkeypatch.setattr(preflight, "node_memory", lambda cfg: (1e15, 1, "a big memory"))
    monkeypatch.setattr(preflight, "planned_peak_bytes", lambda cfg: 1e12)
    assert preflight.check_memory_fit(_container_cfg()).line.endswith("and a big memory is 931,322.6 GiB "
                                                                      "(under 0.01x; see llmtrain plan)")
    assert preflight.check_memory_fit(_container_cfg("cluster=slurm")) is None
    _with(monkeypatch, "slurm", launcher_is_the_node=True)
    assert preflight.check_memory_fit(_container_cfg("cluster=slurm")) is not None


def test_hostfile_slots_need_a_backend_that_uses_a_hostfile():
    from llmtrain.launch.config_probes import compose_here

    for name in ("local", "kubernetes"):  # an unknown name is refused by the choices later, never a KeyError here
        with pytest.raises(ConfigError) as e:
            compose_here([f"cluster.name={name}", "cluster.nproc_per_node=null"])
        assert str(e.value) == "cluster.nproc_per_node: null (the hostfile's slots) needs cluster=ssh; give a number"
