"""The suite on three pytest-xdist workers (`-n 3` in pyproject.toml's addopts) with what each test sees unchanged:
- every test of a module runs on one worker, so a module-scoped fixture (one launch shared by several checks) runs
  once;
- every test marked `cluster` runs on one worker: the two-node test cluster can be up only once on a machine;
- the groups are handed out longest first (the cluster's, then modules by their number of `slow` tests, the unit
  tests last), so that the workers end together instead of one finishing the longest group alone;
- a test marked `exclusive` (it measures speed or time) runs while no other test runs. Each test holds a lock on a
  file of this run: shared, or exclusive for an `exclusive` test. A turnstile in front of it lets a waiting
  exclusive test in before the other workers' next tests, so it never waits for more than the test in progress.
Several-rank tests do run at once: on two cores each takes longer, but the pair ends sooner than one after the
other, since much of a launch is waiting (interpreters starting, rendezvous, files).
Under plain `pytest -n 0` none of this applies.

LLMTRAIN_TEST_TIMELINE=FILE appends a JSON line per test: its worker, when it asked for its turn, got it and
ended (time.time()); the gaps show what the lock costs (docs/testing.md)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time

import pytest

CLUSTER_GROUP = "two-node cluster"


def group_of(item: pytest.Item) -> str:
    if item.get_closest_marker("cluster"):
        return CLUSTER_GROUP
    return item.path.stem


def add_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The xdist_group of every test (read by `--dist loadgroup`), and on a worker the items reordered so that the
    groups come longest first: xdist hands the groups out in the order their first tests appear."""
    slow_tests: dict[str, int] = {}
    for item in items:
        group = group_of(item)
        item.add_marker(pytest.mark.xdist_group(group))
        slow_tests[group] = slow_tests.get(group, 0) + (item.get_closest_marker("slow") is not None)
    if getattr(config, "workerinput", None) is None:  # not an xdist worker: the collection order stays
        return
    rank = {g: (g != CLUSTER_GROUP, -n) for g, n in slow_tests.items()}
    items.sort(key=lambda item: rank[group_of(item)])  # stable: a module keeps its order


def _lock_path(config: pytest.Config, name: str) -> str | None:
    workerinput = getattr(config, "workerinput", None)  # set on xdist workers only
    if workerinput is None:
        return None
    return os.path.join(tempfile.gettempdir(), f"llmtrain-tests-{workerinput['testrunuid']}.{name}")


@contextlib.contextmanager
def turn(item: pytest.Item):
    """Held around one test's set-up, call and tear-down: alone for an `exclusive` test, else beside others."""
    asked = time.time()
    with _held(item):
        started = time.time()
        try:
            yield
        finally:
            _record(item, asked, started)


def _record(item: pytest.Item, asked: float, started: float) -> None:
    path = os.environ.get("LLMTRAIN_TEST_TIMELINE")
    if path:
        worker = getattr(item.config, "workerinput", {}).get("workerid", "main")
        line = json.dumps({"worker": worker, "test": item.nodeid, "exclusive": _alone(item), "asked": asked,
                           "started": started, "ended": time.time()})
        with open(path, "a") as f:
            f.write(line + "\n")


def _alone(item: pytest.Item) -> bool:
    return item.get_closest_marker("exclusive") is not None


@contextlib.contextmanager
def _held(item: pytest.Item):
    main, gate = _lock_path(item.config, "lock"), _lock_path(item.config, "turnstile")
    if main is None:
        yield
        return
    with open(main, "a") as held, open(gate, "a") as turnstile:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(held, fcntl.LOCK_EX if _alone(item) else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
