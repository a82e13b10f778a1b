"""Evidence a rank gives when the launcher suspects a hang: SIGUSR2 (SIGTERM and SIGUSR1 mean preemption).

faulthandler writes every thread's Python stack from inside the signal handler, so it works even while the main
thread waits in a collective or in C code. Python's own handler cannot run then (it waits for the main thread), so
the signal's byte also goes to a wakeup pipe read by a small thread, which copies the stacks and writes the
collective trace into the evidence folder the launcher named (RUN_DIR/hangs/request).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import signal
import threading

from llmtrain.rundir.hang_files import requested_folder, write_json
from llmtrain.rundir.paths import RunPaths
from llmtrain.train.collective_trace import CollectiveTrace

DUMP_SIGNAL = signal.SIGUSR2


def install(run_dir: str, rank: int, trace: CollectiveTrace) -> None:
    """Call from the main thread, before the process group starts its threads."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(exit_trace_path(run_dir, rank))  # an earlier attempt's
    stacks_path = RunPaths(run_dir).rank_stacks(rank)
    stacks = open(stacks_path, "w+")  # kept open: faulthandler writes to its fd from the signal handler
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # set_wakeup_fd requires it; a full pipe only drops a byte
    signal.signal(DUMP_SIGNAL, lambda *_: None)
    signal.set_wakeup_fd(write_end)
    # chain: after the stacks, the Python handler above runs, which is what writes the byte to the pipe.
    faulthandler.register(DUMP_SIGNAL, file=stacks, all_threads=True, chain=True)

    def serve() -> None:
        while True:
            for byte in os.read(read_end, 64):
                if byte == DUMP_SIGNAL:
                    with contextlib.suppress(OSError):  # a full disk: no evidence, but the next request may work
                        _dump(run_dir, rank, stacks, trace)

    threading.Thread(target=serve, name="llmtrain-hang-evidence", daemon=True).start()


def exit_trace_path(run_dir: str, rank: int) -> str:
    return RunPaths(run_dir).rank_exit_trace(rank)


def write_exit_trace(run_dir: str, rank: int, trace: CollectiveTrace) -> None:
    """On the way out with an error: a rank that timed out in a collective is gone before the launcher asks."""
    with contextlib.suppress(OSError):
        write_json(exit_trace_path(run_dir, rank), {"rank": rank, **trace.snapshot()})


def _dump(run_dir: str, rank: int, stacks, trace: CollectiveTrace) -> None:
    folder = requested_folder(run_dir)
    if folder is None or not os.path.isdir(folder):
        return
    stacks.flush()
    stacks.seek(0)
    with open(os.path.join(folder, f"rank{rank}.stacks.txt"), "w") as out:
        shutil.copyfileobj(stacks, out)
    stacks.seek(0)
    stacks.truncate()  # the next dump starts from an empty file
    _dump_nccl_trace(os.path.join(folder, f"rank{rank}.nccl_trace.pkl"))
    write_json(os.path.join(folder, f"rank{rank}.collectives.json"), {"rank": rank, **trace.snapshot()})


def _dump_nccl_trace(path: str) -> None:
    """PyTorch's Flight Recorder for NCCL (TORCH_FR_BUFFER_SIZE, set by the launcher), where this build and
    this process group have it; read it with `python -m torch.distributed.flight_recorder.fr_trace`."""
    import torch
    import torch.distributed as dist

    dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
    if dump is None or not dist.is_initialized() or not torch.cuda.is_available():
        return
    try:
        data = dump()
    except RuntimeError:  # no NCCL group in this process
        return
    with open(path, "wb") as f:
        f.write(data)
