"""What torchrun runs on every rank: `python -m llmtrain.worker RUN_DIR`.

Reads the frozen config from RUN_DIR/config.yaml, sends its own output to RUN_DIR/logs/rank{R}.log, initializes
the process group (gloo on CPU, NCCL for CUDA tensors) and trains. RUN_DIR/logs/rank{R}.status records how the
rank ended, so the launcher can name the rank that failed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import traceback
from datetime import timedelta

from llmtrain.errors import STORAGE_ERRNOS, StorageError, storage_reason
from llmtrain.launch.supervision.placement import record_place
from llmtrain.rundir import rank_files, space_reserve
from llmtrain.rundir.paths import RunPaths


class RankLog:
    """sys.stdout / sys.stderr of a rank, writing to its log: a full disk there is named like any run-dir file's
    (StorageError: `no space left on device writing RUN_DIR/logs/rank0.log`), not as a bare OSError."""

    def __init__(self, stream, path: str):
        self._stream = stream
        self._path = path

    def _named(self, write, *args):
        try:
            return write(*args)
        except OSError as e:
            if e.errno in STORAGE_ERRNOS and not isinstance(e, StorageError):
                raise StorageError(self._path, e) from e
            raise

    def write(self, text: str) -> int:
        return self._named(self._stream.write, text)

    def flush(self) -> None:
        self._named(self._stream.flush)

    def __getattr__(self, name: str):  # fileno, isatty, encoding, ... of the real stream
        return getattr(self._stream, name)


def redirect_output(log_path: str) -> None:
    """Point fds 1 and 2 at the rank's log, so tracebacks and native crashes land there too."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = RankLog(os.fdopen(1, "w", buffering=1, closefd=False), log_path)
    sys.stderr = RankLog(os.fdopen(2, "w", buffering=1, closefd=False), log_path)


def _write_status(run_dir: str, rank: int, status: str, error: str | None = None, **extra) -> None:
    """How the rank ended; on a disk that filled up, in the room its reserve kept (which goes either way)."""
    record = {"status": status, "error": error, "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
              "host": socket.gethostname(), **extra}
    reserve = RunPaths(run_dir).rank_reserve(rank)
    try:
        space_reserve.write_with_room(reserve, lambda: rank_files.write_status(run_dir, rank, record))
    finally:
        space_reserve.release(reserve)


def error_words(e: BaseException) -> str:
    """What a rank's status records of the error it died of: a full, over-quota or read-only storage as
    `no space left on device writing FILE`, anything else as `Type: message`."""
    if isinstance(e, StorageError):
        return str(e)
    if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
        reason = STORAGE_ERRNOS[e.errno]
        return f"{reason} writing {e.filename}" if e.filename else f"{reason} ({e})"
    return f"{type(e).__name__}: {e}"


def init_process_group(device_type: str, timeout_s: int) -> None:
    import torch.distributed as dist

    backend = "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m llmtrain.worker RUN_DIR", file=sys.stderr)
        return 2
    run_dir = os.path.abspath(argv[0])
    rank = int(os.environ.get("RANK", 0))
    paths = RunPaths(run_dir)
    os.makedirs(paths.logs, exist_ok=True)
    redirect_output(paths.rank_log(rank))
    space_reserve.hold(paths.rank_reserve(rank))  # before anything can fill the disk
    record_place(run_dir, rank)

    import torch
    import torch.distributed as dist

    from llmtrain.checkpoint.resume import Resolution
    from llmtrain.config import load_run_config
    from llmtrain.launch.launch_record import batch_origin, newest_launch
    from llmtrain.launch.config_probes import validate_here
    from llmtrain.launch.shape.start_record import config_for_start
    from llmtrain.train import collective_trace, collective_wait, hang_signals
    from llmtrain.train.preemption import Preempted, PreemptionFlag
    from llmtrain.train.device import resolve_device
    from llmtrain.train.trainer import Trainer

    try:
        entry = newest_launch(run_dir)
        # A start on fewer nodes than asked trains the layout its launcher recorded (launch/shape/).
        cfg = config_for_start(load_run_config(paths.config), entry, int(os.environ.get("WORLD_SIZE", 1)))
        # The launcher validated it on its node; this node may lack what it found there (a package, a file).
        validate_here(cfg)
        if cfg.launch.straggler_factor:
            # Under the trace's wrappers, which then still record the caller of each collective as its site.
            collective_wait.install()
        # Before the process group starts its threads: they inherit the signal setup.
        hang_signals.install(run_dir, rank, collective_trace.install())
        torch.manual_seed(cfg.train.seed)
        device = resolve_device(cfg.device, int(os.environ.get("LOCAL_RANK", 0)))
        init_process_group(device.type, cfg.launch.pg_timeout_s)
        # The checkpoint the launcher announced (PATH may read otherwise in this node's working directory).
        launched = Resolution.from_record(entry.get("resume"), cfg.checkpoint.resume)
        trainer = Trainer(cfg, run_dir, device, launched, batch_origin(entry, cfg.train.global_batch_size))
        trainer.train()
        PreemptionFlag.ignore_from_now()
    except Preempted as e:
        PreemptionFlag.ignore_from_now()
        # Exit 0 so torchrun does not restart us; the launcher reads "preempted" from the status file.
        # The launcher says it (once): this rank's log already shows the save.
        _write_status(run_dir, rank, "preempted", str(e), step=e.step, saved=e.saved)
        if dist.is_initialized():
            dist.destroy_process_group()
        return 0
    except BaseException as e:  # noqa: BLE001 - every way out is recorded for the launcher
        # On a full disk each of these writes may fail too: none may keep the others, or the exit, from happening.
        full = storage_reason(e) is not None
        with contextlib.suppress(OSError):
            _write_status(run_dir, rank, "error", error_words(e))
        with contextlib.suppress(OSError):
            if full:  # the storage's own error is its one line: its traceback only says where the write was
                print(f"llmtrain: rank {rank}: {error_words(e)}")
            else:
                traceback.print_exc()
        with contextlib.suppress(OSError):
            hang_signals.write_exit_trace(run_dir, rank, collective_trace.TRACE)
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            sys.stderr.flush()
        # os._exit: skip interpreter teardown that can hang on a broken process group.
        os._exit(1)
    # The step reached and the goal: a run stopped by train.stop_at_step ended well, short of train.max_steps.
    _write_status(run_dir, rank, "ok", state_bytes=trainer.state_bytes, step=trainer.step,
                  max_steps=cfg.train.max_steps)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
