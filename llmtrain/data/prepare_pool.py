"""Tokenizing the inputs of `llmtrain data prepare` in worker processes: each input unit (a file, or a chunk of one)
goes to a part file of its own, and the results come back in input order, with at most two units per worker
dispatched or finished ahead of the one being appended (the bound on part files on disk). The units are taken from
their iterator only as they are dispatched (a chunk is read then). A file's error stops the run at once; a later
chunk's comes back in its place in the order, as reading the file in one piece would meet it."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import traceback
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from typing import Iterable, Iterator

from .encoders import ByteEncoder, TokenizerEncoder, load_tokenizer
from .errors import DataError
from .prepare_options import InputStats, InputUnit, PrepareOptions
from .readers import NotText, tokenize_input

# Units dispatched or finished but not yet appended, per worker.
UNITS_AHEAD_PER_WORKER = 2
_PR_SET_PDEATHSIG = 1
_WORKER_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1}
_CAN_MASK = hasattr(signal, "pthread_sigmask")


@dataclass
class UnitResult:
    unit: InputUnit
    part: str  # the file holding the unit's tokens (empty when the unit is not text)
    stats: InputStats | None  # None when the unit is not text
    not_text: str | None = None  # "binary" or "compressed"
    error: Exception | None = None  # what reading or tokenizing it raised: the caller raises it in its turn


def make_encoder(options: PrepareOptions):
    if options.tokenizer is None:
        return ByteEncoder(options.separator)
    return TokenizerEncoder(load_tokenizer(options.tokenizer), options.eot_token)


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def tokenize_unit(unit: InputUnit, part: str, encoder, options: PrepareOptions) -> UnitResult:
    """Tokenize one unit into the new file `part`; a unit that is not text leaves no part file."""
    try:
        with open(part, "wb") as out:
            stats = tokenize_input(unit, encoder, out, options)
    except NotText as e:
        os.unlink(part)
        return UnitResult(unit, "", None, e.reason)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
    return UnitResult(unit, part, stats)


@contextlib.contextmanager
def tokenized_units(
    units: Iterable[InputUnit], options: PrepareOptions, workers: int, parts_dir: str, encoder
) -> Iterator[Iterator[UnitResult]]:
    """Yield an iterator of the units' results in input order; part files are written in `parts_dir`.
    Worker processes are started on entry and ended on exit, whatever happened."""
    if workers <= 1:
        yield _in_process(units, options, parts_dir, encoder)
        return
    pool = _WorkerPool(workers, options)
    try:
        yield pool.results(units, parts_dir)
        pool.stop()
    finally:
        pool.kill()


def _in_process(units: Iterable[InputUnit], options: PrepareOptions, parts_dir: str, encoder
                ) -> Iterator[UnitResult]:
    for i, unit in enumerate(units):
        try:
            yield tokenize_unit(unit, _part_path(parts_dir, i), encoder, options)
        except DataError as e:
            yield UnitResult(unit, "", None, error=e)


def _part_path(parts_dir: str, index: int) -> str:
    return os.path.join(parts_dir, f"unit-{index:08d}.bin")


class _WorkerPool:
    def __init__(self, count: int, options: PrepareOptions):
        # fork starts in milliseconds and needs nothing re-imported; elsewhere spawn is the safe choice.
        ctx = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
        forked = ctx.get_start_method() == "fork"
        self.workers: list[tuple[multiprocessing.Process, object]] = []
        for i in range(count):
            parent_end, child_end = ctx.Pipe()
            # A forked child inherits the parent's ends of earlier workers' pipes: it closes them so that each
            # worker sees EOF as soon as the parent is gone.
            inherited = [conn for _, conn in self.workers] + [parent_end] if forked else []
            process = ctx.Process(target=_worker_main, args=(child_end, options, os.getpid(), inherited),
                                  name=f"llmtrain-prepare-{i}", daemon=True)
            # Blocked across the fork, a signal waits until the worker has its own handlers: it never runs this
            # process's (which would print a traceback from the worker).
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _WORKER_SIGNALS) if _CAN_MASK else None
            try:
                process.start()
            finally:
                if blocked is not None:
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            child_end.close()
            self.workers.append((process, parent_end))

    def results(self, units: Iterable[InputUnit], parts_dir: str) -> Iterator[UnitResult]:
        ahead = UNITS_AHEAD_PER_WORKER * len(self.workers)
        idle = list(self.workers)
        busy: dict[object, tuple[multiprocessing.Process, object, int]] = {}  # conn or sentinel -> work
        done: dict[int, UnitResult] = {}
        sent: dict[int, InputUnit] = {}
        pending, more = iter(units), True
        next_send = next_yield = 0
        while more or next_yield < next_send:
            while idle and more and next_send - next_yield < ahead:
                unit = next(pending, None)
                if unit is None:
                    more = False
                    break
                process, conn = idle.pop()
                try:
                    conn.send((unit, _part_path(parts_dir, next_send)))
                except OSError:  # the worker died while idle
                    raise _died(process, unit) from None
                busy[conn] = busy[process.sentinel] = (process, conn, next_send)
                sent[next_send] = _without_text(unit)
                next_send += 1
            if next_yield == next_send:
                continue  # all yielded, and nothing more to send
            if next_yield in done:
                sent.pop(next_yield, None)
                yield done.pop(next_yield)
                next_yield += 1
                continue
            ready = wait(list(busy))
            for handle in sorted(ready, key=lambda h: isinstance(h, int)):  # answers before deaths
                if handle not in busy:
                    continue
                process, conn, index = busy[handle]
                try:
                    message = conn.recv() if handle is conn else None
                except EOFError:
                    message = None
                if message is None:
                    raise _died(process, sent[index])
                done[index] = _outcome(message, sent[index])
                # A file's error stops the run at once; a later chunk's waits for its turn (its file may yet be
                # skipped as not text, which drops it).
                if done[index].error is not None and sent[index].first:
                    raise done[index].error
                del busy[conn], busy[process.sentinel]
                idle.append((process, conn))

    def stop(self) -> None:
        for process, conn in self.workers:
            with contextlib.suppress(OSError):
                conn.send(None)
        for process, _ in self.workers:
            process.join(timeout=5)

    def kill(self) -> None:
        for process, conn in self.workers:
            if process.is_alive():
                process.terminate()
        for process, conn in self.workers:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
            conn.close()


def _without_text(unit: InputUnit) -> InputUnit:
    """What is kept of a dispatched unit until its result is appended: a chunk's text is the worker's alone."""
    return unit if unit.chunk is None else replace(unit, chunk=replace(unit.chunk, data=b""))


def _died(process: multiprocessing.Process, unit: InputUnit) -> DataError:
    process.join(timeout=1)
    where = unit.name + (f" (lines from {unit.chunk.first_line})" if unit.chunk is not None else "")
    return DataError("--workers", f"a worker process died (exit code {process.exitcode}) while tokenizing "
                                  f"{where}; out of memory? try fewer --workers")


def _outcome(message: tuple, unit: InputUnit) -> UnitResult:
    kind, value = message
    if kind == "ok":
        value.unit = unit  # the worker sends it back without its unit (a chunk's text)
        return value
    if kind == "data_error":
        return UnitResult(unit, "", None, error=DataError(*value))
    return UnitResult(unit, "", None, error=RuntimeError(f"a data prepare worker failed:\n{value}"))


def _worker_main(conn, options: PrepareOptions, parent_pid: int, inherited: list) -> None:
    # Ctrl-C at a terminal reaches the whole process group: the parent alone handles it and ends the workers,
    # which die quietly on SIGTERM (no traceback from each).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    if _CAN_MASK:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _WORKER_SIGNALS)
    _die_with_parent(parent_pid)
    for other in inherited:
        other.close()
    # One tokenizer thread per worker, so N workers use N cores (read when the tokenizer first runs in parallel).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    try:
        encoder = make_encoder(options)
    except DataError as e:
        encoder, failure = None, ("data_error", (e.key, e.message))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        if encoder is None:
            conn.send(failure)
            continue
        unit, part = task
        try:
            result = tokenize_unit(unit, part, encoder, options)
            result.unit = None
            message = ("ok", result)
        except DataError as e:
            message = ("data_error", (e.key, e.message))
        except OSError as e:
            message = ("data_error", ("--input", f"{unit.name}: {e.strerror or e}"
                                                 + (f": {e.filename}" if e.filename else "")))
        except Exception:
            message = ("crash", f"{unit.name}: {traceback.format_exc()}")
        conn.send(message)


def _die_with_parent(parent_pid: int) -> None:
    """Linux: the kernel kills this worker when the parent dies, even by SIGKILL (no orphans)."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the line above took effect
