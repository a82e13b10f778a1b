"""How a gpu_check part stops at its time limit: at once, with every process it started.

llmtrain's launcher and workers take SIGTERM, SIGUSR1 and SIGHUP as a preemption and SIGINT as a graceful stop
(whose SIGTERM to the workers is a preemption too): they would first save a checkpoint the check does not need (a
gpt-1.3b one is ~17 GiB, about a minute). So at its limit a part SIGKILLs the whole tree it started (launchers,
node agents, torchrun, workers: nothing can save) and exits 124, the code `timeout` gives; a Ctrl-C or SIGTERM to
the part does the same with 130 or 143.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

EXIT_TIMED_OUT = 124
stopping = threading.Event()  # set once the part is being stopped: nothing more may start or write its row


def stop_now(why: str, code: int) -> None:
    """Kill every process this one started (SIGKILL) and exit with `code`, now."""
    from llmtrain.launch.supervision.processes import kill_all

    stopping.set()
    started = time.monotonic()
    print(f"\ngpu_check: {why}: stopping at once (SIGKILL to every process it started: no checkpoint is saved)",
          flush=True)
    n = kill_all()  # this process's descendants, also those in sessions of their own (torchrun's workers)
    print(f"gpu_check: killed {n} process(es) in {time.monotonic() - started:.1f} s", flush=True)
    sys.stdout.flush()
    os._exit(code)


def arm(seconds: float, part: str) -> threading.Timer:
    """Stop the part `seconds` from now (a timer thread: it fires whatever the main thread waits on)."""
    import llmtrain.launch.supervision.processes  # noqa: F401  imported now, not by the timer mid-way through another import

    timer = threading.Timer(seconds, stop_now, args=(f"{part} reached its limit of {seconds:g} s", EXIT_TIMED_OUT))
    timer.daemon = True
    timer.start()
    return timer


def stop_on_signals(part: str) -> None:
    """Ctrl-C or SIGTERM to the part: stop as at the limit (the launcher's own handling would save first)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: stop_now(f"{part}: {signal.Signals(signum).name}", 128 + signum))


def halt_if_stopping() -> None:
    """Called before a part starts a process or writes its row: once it is being stopped, wait for the exit."""
    while stopping.is_set():
        time.sleep(1)
