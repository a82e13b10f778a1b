"""The hang verdict from collective records and stacks alone (no processes)."""

from __future__ import annotations

from llmtrain.launch.supervision.hang_verdict import (IN_BACKWARD, IN_COLLECTIVE, IN_DATA, IN_OPTIMIZER, SLEEPING,
                                                      UNKNOWN, classify, main_thread_frames, stack_summary, verdict)

DP = [0, 1, 2, 3]


def record(seq: int, done: int, op: str = "all_reduce", group: str = "dp", ranks=DP, at: float = 100.0,
           site: str = "train_step (trainer.py:214)", recent=None) -> dict:
    return {"groups": {group: {"op": op, "seq": seq, "done": done, "ranks": ranks, "entered_at": at, "site": site,
                               "recent": recent or [[seq, op, site]]}}}


def dump(*frames: tuple[str, int, str], thread: bool = True) -> str:
    """A faulthandler dump: a helper thread, then the main thread with `frames` (innermost first)."""
    helper = ('Thread 0x00007f1 (most recent call first):\n'
              '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n') if thread else ""
    main = "".join(f'  File "{f}", line {line} in {func}\n' for f, line, func in frames)
    return helper + "Current thread 0x00007f2 (most recent call first):\n" + main


DATA_STACK = dump(("/src/llmtrain/train/fault_injection.py", 61, "hang_here"),
                  ("/src/llmtrain/train/data_feed.py", 41, "train_batch"),
                  ("/src/llmtrain/train/trainer.py", 163, "forward_backward"),
                  ("<frozen runpy>", 88, "_run_code"))
WAIT_STACK = dump(("/py/torch/distributed/distributed_c10d.py", 3252, "all_reduce"),
                  ("/src/llmtrain/train/trainer.py", 214, "train_step"))


def test_the_rank_behind_never_entered_and_its_stack_says_where_it_is():
    records = {0: record(25, 24), 1: record(24, 24), 2: record(25, 24, at=99.0), 3: record(25, 24)}
    stacks = {0: WAIT_STACK, 1: DATA_STACK, 2: WAIT_STACK, 3: WAIT_STACK}
    line = verdict(records, stacks, 4, describe=lambda r: f"rank {r} (node 0, host h, local rank {r})")
    assert line == ("rank 1 (node 0, host h, local rank 1) never entered all_reduce #25 on the dp group; "
                    "ranks 0, 2, 3 wait in it; rank 1 is in data loading (stack: hang_here (fault_injection.py:61) "
                    "< train_batch (data_feed.py:41) < forward_backward (trainer.py:163))")


def test_ranks_in_a_row_are_written_as_a_range_and_a_silent_rank_is_named_with_its_state():
    records = {r: record(7, 6, op="barrier", group="world", ranks=[0, 1, 2, 3]) for r in (0, 1, 2)}
    line = verdict(records, {r: WAIT_STACK for r in records}, 4, states={3: "stopped"})
    assert line == ("rank 3 never entered barrier #7 on the world group; ranks 0-2 wait in it; rank 3 did not "
                    "answer the stack request (process stopped)")


def test_the_oldest_wait_decides_between_two_groups():
    # Rank 1 waits on tp since t=50 for rank 0, which went on to wait on dp from t=60: tp is where it stopped.
    records = {0: {"groups": {**record(3, 3, group="tp", ranks=[0, 1])["groups"],
                              **record(9, 8, group="dp", ranks=[0, 2], at=60.0)["groups"]}},
               1: record(4, 3, group="tp", ranks=[0, 1], at=50.0),
               2: record(8, 8, group="dp", ranks=[0, 2])}
    line = verdict(records, {0: WAIT_STACK, 1: WAIT_STACK, 2: DATA_STACK}, 3)
    assert line.startswith("rank 0 never entered all_reduce #4 on the tp group; rank 1 waits in it; rank 0 waits "
                           "in all_reduce #9 on the dp group (from train_step (trainer.py:214))"), line


def test_a_skipped_op_is_found_by_its_call_site_when_the_numbers_agree():
    flags, loss, grads = "train_step (trainer.py:214)", "global_mean_loss (trainer.py:255)", "foreach_reduce (f.py:9)"
    history = [[n, "all_reduce", site] for n, site in enumerate([grads, flags, loss] * 3, start=1)]
    healthy = history + [[10, "all_reduce", grads], [11, "all_reduce", flags]]
    skipped = history + [[10, "all_reduce", grads], [11, "all_reduce", loss]]
    records = {0: record(11, 10, ranks=[0, 1], site=flags, recent=healthy),
               1: record(11, 10, ranks=[0, 1], site=loss, recent=skipped)}
    line = verdict(records, {0: WAIT_STACK, 1: WAIT_STACK}, 2)
    assert line.startswith("rank 1 never entered all_reduce #11 on the dp group (from train_step (trainer.py:214)); "
                           "rank 0 waits in it; rank 1 waits in all_reduce #11 on the dp group (from global_mean_loss "
                           "(trainer.py:255))"), line


def test_every_member_in_the_same_op_blames_no_rank():
    records = {r: record(5, 4, ranks=[0, 1]) for r in (0, 1)}
    assert verdict(records, {}, 2) == ("ranks 0, 1 wait in all_reduce #5 on the dp group, which every member "
                                       "entered (a transport or device problem, not a rank that stayed behind)")


def test_no_collective_pending_lists_what_each_rank_does():
    records = {r: record(5, 5, ranks=[0, 1]) for r in (0, 1)}
    line = verdict(records, {0: DATA_STACK, 1: dump(("/src/x.py", 1, "f"))}, 2)
    assert line == ("no rank waits in a collective; rank 0 is in data loading (stack: hang_here "
                    "(fault_injection.py:61) < train_batch (data_feed.py:41) < forward_backward (trainer.py:163)); "
                    "rank 1 is in unknown code (stack: f (x.py:1))")


def test_a_rank_that_timed_out_and_exited_waits_with_its_exit_trace():
    # Both exited with an error (no stacks); rank 0 had entered barrier #7, rank 1 had not.
    records = {0: record(7, 6, op="barrier", group="world", ranks=[0, 1]),
               1: record(6, 6, op="barrier", group="world", ranks=[0, 1])}
    line = verdict(records, {}, 2)
    assert line == ("rank 1 never entered barrier #7 on the world group; rank 0 waits in it; rank 1 exited (its "
                    "trace is the one it wrote on its way out)")


def test_classification_of_stacks():
    def frames(*paths_funcs):
        return [(p, 1, f) for p, f in paths_funcs]

    assert classify(frames(("/py/torch/distributed/distributed_c10d.py", "wait"))) == IN_COLLECTIVE
    assert classify(frames(("/py/torch/optim/adamw.py", "step"), ("/src/trainer.py", "train_step"))) == IN_OPTIMIZER
    assert classify(frames(("/py/torch/autograd/graph.py", "_engine_run_backward"))) == IN_BACKWARD
    assert classify(frames(("/src/x.py", "f")), source=lambda f, n: "    time.sleep(5)\n") == SLEEPING
    assert classify(frames(("/src/x.py", "f")), source=lambda f, n: "    x = 1\n") == UNKNOWN
    assert classify(main_thread_frames(DATA_STACK)) == IN_DATA
    assert classify([]) == UNKNOWN


def test_the_wait_timers_wrappers_are_not_where_a_rank_is():
    # A synchronous all_reduce waits on its work handle, whose wait() straggler detection times: a wrapper innermost.
    waiting = [("/src/llmtrain/train/collective_wait.py", 60, "wrapper"),
               ("/py/torch/distributed/distributed_c10d.py", 3252, "all_reduce"),
               ("/src/llmtrain/train/collective_wait.py", 64, "wrapper"),
               ("/src/llmtrain/train/collective_trace.py", 99, "wrapper"),
               ("/src/llmtrain/train/trainer.py", 290, "global_mean_loss")]
    assert classify(waiting) == IN_COLLECTIVE
    assert stack_summary(waiting) == "all_reduce (distributed_c10d.py:3252) < global_mean_loss (trainer.py:290)"


def test_the_main_thread_is_the_one_not_started_by_threading():
    frames = main_thread_frames(DATA_STACK)
    assert frames[0] == ("/src/llmtrain/train/fault_injection.py", 61, "hang_here")
    assert frames[-1][2] == "_run_code"
    assert main_thread_frames("garbage\n") == []
