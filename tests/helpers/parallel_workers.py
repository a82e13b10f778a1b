"""The suite on two pytest-xdist workers (`-n 2` in pyproject.toml's addopts) with what each test sees unchanged:
- every test of a module runs on one worker, so a module-scoped fixture (one launch shared by several checks) runs
  once;
- every test marked `cluster` runs on one worker: the two-node test cluster can be up only once on a machine;
- a test marked `exclusive` (it measures speed or time) runs while no other test runs. Each test holds a lock on a
  file of this run: shared, or exclusive for an `exclusive` test. A turnstile in front of it lets a waiting
  exclusive test in before the other worker's next test, so it never waits for more than the test in progress;
- two `slow` tests (several ranks each) never run at once outside the cluster: on two cores their ranks would take
  turns inside every collective. A slow test beside a one-process test, or beside the cluster's tests (which
  mostly wait on Slurm), uses the cores that would otherwise idle.
Under plain `pytest -n 0` none of this applies."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile

import pytest

CLUSTER_GROUP = "two-node cluster"


def group_of(item: pytest.Item) -> str:
    if item.get_closest_marker("cluster"):
        return CLUSTER_GROUP
    return item.path.stem


def add_groups(items: list[pytest.Item]) -> None:
    """The xdist_group of every test (read by `--dist loadgroup`)."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item)))


def _lock_path(config: pytest.Config, name: str) -> str | None:
    workerinput = getattr(config, "workerinput", None)  # set on xdist workers only
    if workerinput is None:
        return None
    return os.path.join(tempfile.gettempdir(), f"llmtrain-tests-{workerinput['testrunuid']}.{name}")


@contextlib.contextmanager
def turn(item: pytest.Item):
    """Held around one test's set-up, call and tear-down: alone for an `exclusive` test, else beside others."""
    main, gate = _lock_path(item.config, "lock"), _lock_path(item.config, "turnstile")
    if main is None:
        yield
        return
    alone = item.get_closest_marker("exclusive") is not None
    ranks = not alone and item.get_closest_marker("slow") is not None and item.get_closest_marker("cluster") is None
    with open(main, "a") as held, open(gate, "a") as turnstile, open(_lock_path(item.config, "ranks"), "a") as slow:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(held, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        if ranks:  # taken after the shared lock, as every holder of this one does: no cycle
            fcntl.flock(slow, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(slow, fcntl.LOCK_UN)
            fcntl.flock(held, fcntl.LOCK_UN)
