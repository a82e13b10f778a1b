"""The suite on three pytest-xdist workers (`-n 3` in pyproject.toml's addopts) with what each test sees unchanged:
- every test of a module runs on one worker, so a module-scoped fixture (one launch shared by several checks) runs
  once;
- every test of a module named `test_cluster_*.py` (and only those are marked `cluster`) runs on one worker: the
  two-node test cluster can be up only once on a machine;
- the groups are handed out longest first (the cluster's, then modules by their number of `slow` tests, the unit
  tests last), so that the workers end together instead of one finishing the longest group alone;
- a test marked `exclusive` (it measures speed or time) runs while no other test runs. Each test holds a lock on a
  file of this run: shared, or exclusive for an `exclusive` test. A turnstile in front of it lets a waiting
  exclusive test in before the other workers' next tests, so it never waits for more than the test in progress.
Several-rank tests do run at once: on two cores each takes longer, but the pair ends sooner than one after the
other, since much of a launch is waiting (interpreters starting, rendezvous, files).
Under plain `pytest -n 0` none of this applies.

The groups are made by the controller's own scheduler (`ModuleGroupScheduling`, from a test's file name alone), not
by markers added at collection: pytest-xdist's `xdist_group` marks reach its scheduler only through a rewritten
test id, which some pytest/xdist pairs drop (pytest 9.2 with xdist 3.8 ran every group's tests anywhere).

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
CLUSTER_MODULE_PREFIX = "test_cluster_"


def group_of_nodeid(nodeid: str) -> str:
    """The worker group of a test id: its module's path, or the cluster's group for a `test_cluster_*.py` module."""
    path = nodeid.split("::", 1)[0]
    return CLUSTER_GROUP if os.path.basename(path).startswith(CLUSTER_MODULE_PREFIX) else path


def group_of(item: pytest.Item) -> str:
    return group_of_nodeid(item.nodeid)


MISPLACED = pytest.StashKey[str]()


def check_cluster_modules(items: list[pytest.Item]) -> None:
    """A `cluster` test outside a `test_cluster_*.py` module would run on any worker and meet the cluster already
    up on another; a test inside one that is not marked would hold the cluster's worker for nothing. Each such test
    fails at set-up with one line saying so (an error raised at collection on an xdist worker reaches the user only
    as xdist's internal error, without its words)."""
    for item in items:
        in_module = group_of(item) == CLUSTER_GROUP
        if (item.get_closest_marker("cluster") is not None) != in_module:
            where = "is marked cluster outside" if not in_module else "is not marked cluster inside"
            item.stash[MISPLACED] = (f"{item.nodeid} {where} a {CLUSTER_MODULE_PREFIX}*.py module: the two-node "
                                     f"cluster's tests must share one module name prefix so one worker runs them all")


def refuse_misplaced(item: pytest.Item) -> None:
    """At a test's set-up, before its fixtures (the cluster's among them) start."""
    if MISPLACED in item.stash:
        pytest.fail(item.stash[MISPLACED], pytrace=False)


def order_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker, the items reordered so that the groups come longest first: the scheduler hands the groups out
    in the order their first tests appear in the collection."""
    check_cluster_modules(items)
    if getattr(config, "workerinput", None) is None:  # not an xdist worker: the collection order stays
        return
    slow_tests: dict[str, int] = {}
    for item in items:
        group = group_of(item)
        slow_tests[group] = slow_tests.get(group, 0) + (item.get_closest_marker("slow") is not None)
    rank = {g: (g != CLUSTER_GROUP, -n) for g, n in slow_tests.items()}
    items.sort(key=lambda item: rank[group_of(item)])  # stable: a module keeps its order


def make_scheduler(config: pytest.Config, log):
    """xdist's scope scheduling with our groups as its scopes: a scope (a group) goes to one worker whole."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of_nodeid(nodeid)

    config.stash[SCHEDULER_MADE] = True
    return ModuleGroupScheduling(config, log)


SCHEDULER_MADE = pytest.StashKey[bool]()


def check_scheduler_made(config: pytest.Config) -> None:
    """On the controller, before the first test runs: fail the run at once if xdist scheduled with its own
    scheduler instead of ours (the cluster's tests would spread over the workers)."""
    distributed = getattr(config.option, "numprocesses", None) and getattr(config, "workerinput", None) is None
    if distributed and not config.stash.get(SCHEDULER_MADE, False):
        pytest.exit("tests/helpers/parallel_workers.py: pytest-xdist did not ask conftest.py for its scheduler "
                    "(pytest_xdist_make_scheduler); the tests' groups would not hold. Run with -n 0, or fix the hook",
                    returncode=3)


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
