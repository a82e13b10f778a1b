"""The suite's worker groups (tests/helpers/parallel_workers.py) hold under the pytest and pytest-xdist this machine
has: a throwaway test tree that uses the suite's own conftest hooks runs on three workers, and every module's tests,
and every `test_cluster_*.py` module's tests together, ran on one worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import importlib.util, sys
sys.path.insert(0, {str(TESTS)!r})
spec = importlib.util.spec_from_file_location("suite_conftest", {str(TESTS / "conftest.py")!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
pytest_collection_modifyitems = suite.pytest_collection_modifyitems
pytest_xdist_make_scheduler = suite.pytest_xdist_make_scheduler
pytest_xdist_node_collection_finished = suite.pytest_xdist_node_collection_finished
pytest_runtest_setup = suite.pytest_runtest_setup
"""

RECORDING_TEST = """
import json, os, time{marks}

def _record(request):
    time.sleep(0.2)  # long enough that an idle worker would take the next test if the groups let it
    with open(os.environ["GROUPS_LOG"], "a") as f:
        f.write(json.dumps([request.node.nodeid, os.environ.get("PYTEST_XDIST_WORKER", "main")]) + "\\n")
""" + "".join(f"\ndef test_{i}(request):\n    _record(request)\n" for i in range(3))


def _tree(root: Path, modules: dict[str, str]) -> None:
    (root / "conftest.py").write_text(CONFTEST)
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    cluster: two-node\n    slow: slow\n")
    for name, marks in modules.items():
        (root / f"{name}.py").write_text(RECORDING_TEST.format(marks=marks))


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=root,
                          capture_output=True, text=True, timeout=300, env={**_env(), "GROUPS_LOG": str(root / "log")})


def _env() -> dict[str, str]:  # none of this run's xdist variables
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def test_modules_and_the_cluster_modules_each_run_on_one_worker(tmp_path):
    cluster = "\nimport pytest\npytestmark = pytest.mark.cluster"
    _tree(tmp_path, {"test_cluster_a": cluster, "test_cluster_b": cluster, "test_cluster_c": cluster,
                     "test_m1": "", "test_m2": "", "test_m3": ""})
    result = _pytest(tmp_path, "-n", "3", "--dist", "loadscope", "--no-loadscope-reorder")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ran = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    assert len(ran) == 18
    workers: dict[str, set[str]] = {}
    for nodeid, worker in ran:
        module = nodeid.split("::")[0]
        workers.setdefault("cluster" if module.startswith("test_cluster_") else module, set()).add(worker)
    assert all(len(w) == 1 for w in workers.values()), workers
    assert len(set().union(*workers.values())) == 3  # the work was still spread over the three workers


def test_a_cluster_test_outside_a_cluster_module_fails_naming_itself(tmp_path):
    _tree(tmp_path, {"test_m1": "\nimport pytest\npytestmark = pytest.mark.cluster", "test_cluster_a": ""})
    result = _pytest(tmp_path, "-n", "2", "-rE")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "6 errors" in result.stdout, result.stdout
    lines = result.stdout.splitlines()
    assert ("test_m1.py::test_0 is marked cluster outside a test_cluster_*.py module: the two-node "
            "cluster's tests must share one module name prefix so one worker runs them all") in lines, result.stdout
    assert ("test_cluster_a.py::test_2 is not marked cluster inside a test_cluster_*.py module: the "
            "two-node cluster's tests must share one module name prefix so one worker runs them all") in lines
    assert not (tmp_path / "log").exists()  # no test body ran
