"""`llmtrain launch`: prepare the run directory, start the backend, follow the job, clean up on any exit."""

from __future__ import annotations

import os
import shutil
import signal
import time

from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from llmtrain.checkpoint.location import absolute_locations, tiers_of_config
from llmtrain.checkpoint.ownership import claim
from llmtrain.checkpoint.storage import is_uri
from llmtrain.checkpoint.resume import Resolution, resolve_resume
from llmtrain.config import batch, to_yaml, validate
from llmtrain.config.errors import ConfigError
from llmtrain.console import fold_table, get_console, plain, say
from llmtrain.errors import EXIT_FAILED, EXIT_HANGUP, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED, LlmtrainError
from llmtrain.launch.launch_record import LaunchRecord

from llmtrain.launch import run_identity
from llmtrain.launch.supervision import stopping
from llmtrain.launch.backends.registry import get_backend
from llmtrain.launch.backends.traits import REACHABLE_HOSTS, traits_of
from llmtrain.launch.reachable_starts import run_on_answering_hosts
from llmtrain.launch.shape.check import check_shapes, elastic
from llmtrain.launch.shape.replan import StartShape
from llmtrain.launch.shape.start_record import record_facts
from llmtrain.launch.supervision.failures import rank_statuses, stopped_short
from llmtrain.launch.container import default_python_note
from llmtrain.launch.supervision.hang_report import HangDetected
from llmtrain.launch.supervision.monitor import Monitor, RendezvousTimeout
from llmtrain.launch.goodput_entry import record_start
from llmtrain.launch.resumed_batch import keep_checkpoint_batch
from llmtrain.rundir import goodput
from llmtrain.launch.run_lock import RunDirLock
from llmtrain.parallel.layout import ParallelDims
from llmtrain.train.trackers.stores import check_tracker_stores
from llmtrain.rundir import rank_files
from llmtrain.rundir.atomic import atomic_write_text
from llmtrain.rundir.paths import RunPaths


class PreemptRequest(BaseException):
    """SIGTERM / SIGUSR1 (cluster preemption) or SIGHUP (a closed terminal) reached the launcher: checkpoint and
    stop. A BaseException, like KeyboardInterrupt: code that turns any Exception into an error message (config
    composition) must not eat it. The message is the signal's name."""

    @property
    def hangup(self) -> bool:
        return str(self) == "SIGHUP"

    @property
    def exit_code(self) -> int:
        return EXIT_HANGUP if self.hangup else EXIT_PREEMPTED


def raise_preempt(signum, frame) -> None:
    raise PreemptRequest(signal.Signals(signum).name)


def layout_table(cfg: DictConfig) -> Table:
    dims = ParallelDims.from_config(cfg)
    experts = f", ep={dims.ep} (carved from dp)" if dims.ep > 1 else ""
    context = f" x cp={dims.cp}" if dims.cp > 1 else ""
    table = fold_table(f"rank layout: dp={dims.dp} (replicate {dims.dp_replicate} x shard {dims.dp_shard}){context} "
                       f"x pp={dims.pp} x tp={dims.tp}, zero={dims.zero}{experts}", expand=False)
    dims_shown = ("dp",) + (("cp",) if dims.cp > 1 else ()) + ("pp", "tp") + (("ep",) if dims.ep > 1 else ())
    for col in ("rank", "node", "local rank", *dims_shown):
        table.add_column(col, justify="right")
    nproc = cfg.cluster.nproc_per_node
    for rank in range(dims.world_size):
        c = dims.coords(rank)
        table.add_row(*(str(v) for v in (rank, rank // nproc, rank % nproc, *(c[d] for d in dims_shown))))
    return table


def dry_run(cfg: DictConfig) -> int:
    """Print what a launch would run; refuse what a launch would refuse for memory or a tracker's store, and end
    with the plan's memory against this node's."""
    from llmtrain.launch.preflight import check_memory_fit, memory_unknown_line

    console = get_console()
    run_dir = os.path.abspath(cfg.run.dir)
    cfg.run.dir = run_dir
    absolute_locations(cfg)
    backend = get_backend(cfg, run_dir)
    check_shapes(cfg)
    fit = check_memory_fit(cfg)
    check_tracker_stores(cfg)
    check_checkpoint_store(cfg)
    check_init_from(cfg)
    # A PATH that is no checkpoint is refused here too.
    resolution = resolve_resume(tiers_of_config(cfg, run_dir), cfg.checkpoint.resume)
    console.rule("resolved config")
    plain(to_yaml(cfg), console=console)
    console.print(layout_table(cfg))
    console.print(resolution.line(), markup=False, highlight=False, soft_wrap=True)
    if cfg.data.name == "mix":
        from llmtrain.launch.mixture_plan import mixture_lines

        for line in mixture_lines(cfg):
            plain(f"llmtrain: {line}" if line.startswith("warning") else line, console=console)
    console.rule("commands (nothing was started)")
    note = default_python_note(cfg)
    if note:
        say(note, console=console)
    plain(backend.preview(), console=console)
    line = fit.line if fit is not None else memory_unknown_line(cfg)
    plain(line, console=console)
    return EXIT_OK


def prepare_run_dir(cfg: DictConfig) -> str:
    """Create run.dir with config.yaml (written atomically) and a fresh logs/ status."""
    run_dir = os.path.abspath(cfg.run.dir)
    cfg.run.dir = run_dir
    paths = RunPaths(run_dir)
    os.makedirs(paths.logs, exist_ok=True)
    rank_files.remove_statuses(run_dir)
    # A full disk leaves the run's config.yaml as it was, and no half-written copy.
    atomic_write_text(paths.config, to_yaml(cfg))
    return run_dir


def check_checkpoint_store(cfg: DictConfig) -> None:
    """checkpoint.dir and checkpoint.local_dir, written to once (a probe object, removed again): an unreachable
    endpoint, a missing bucket or a denied write is one line naming the key and the location."""
    from llmtrain.checkpoint.ownership import other_run
    from llmtrain.checkpoint.storage.probe import why_unwritable

    # The fast tier is on the nodes' disks: only where the launcher is the node can it look.
    keys = ("dir", "local_dir") if traits_of(cfg.cluster.name).launcher_is_the_node else ("dir",)
    for key in keys:
        location = cfg.checkpoint.get(key)
        problem = (why_unwritable(location) or other_run(location, os.path.abspath(cfg.run.dir))) if location else None
        if problem:
            raise ConfigError(f"checkpoint.{key}", problem)


def check_init_from(cfg: DictConfig) -> None:
    """model.init_from's tensors against the model the config builds, from the files' headers (no tensor data):
    a wrong folder is one line naming the tensor, the file and both shapes, before any worker starts."""
    if cfg.model.init_from:
        from llmtrain.checkpoint.pretrained import inspect_pretrained

        inspect_pretrained(cfg.model.init_from, cfg.model)


def prepare_data(cfg: DictConfig) -> None:
    if cfg.data.name == "stdlib":
        from llmtrain.data import ensure_stdlib_corpus

        ensure_stdlib_corpus(cfg.data.path, cfg.data.max_bytes)


def check_resume(cfg: DictConfig, console: Console, origins: dict[str, str] | None = None) -> Resolution:
    """Before anything starts: what checkpoint.resume resolves to (its checkpoint None: a fresh start), refused
    when it would start a different run in run.dir, and what differs from the checkpoint's config. `origins`
    (compose_here's): a run moved aside takes back the default global batch instead of its checkpoint's."""
    from llmtrain.checkpoint import store
    from llmtrain.checkpoint.export import load_checkpoint_config
    from llmtrain.checkpoint.diff import check_positions, check_resumable, context_change, describe_change
    from llmtrain.data.identity import data_changes

    run_dir = os.path.abspath(cfg.run.dir)
    tiers = tiers_of_config(cfg, run_dir)  # this launch's, not those of the config.yaml it replaces
    run_identity.moved_location(cfg, run_dir, cfg.checkpoint.resume)
    resolution = resolve_resume(tiers, cfg.checkpoint.resume)
    path, old = resolution.checkpoint, None
    if path is not None:
        store.verify(path, crc=not is_uri(path))  # a store's CRCs would cost a download of the checkpoint
        old = load_checkpoint_config(path)
        if not cfg.run.overwrite:  # said as itself, not as the new run in run.dir it would otherwise be
            check_positions(old, cfg, path)
    why, aside = run_identity.conflict(cfg, run_dir, path, old)
    if why:
        say(run_identity.refuse_or_move_aside(cfg, run_dir, why, aside), console=console)
        resolution = resolve_resume(tiers, cfg.checkpoint.resume)  # the run moved aside: resolved again
        path = resolution.checkpoint
        if path is None and origins is not None and origins.get(batch.GLOBAL_KEY) == "checkpoint":
            keep_checkpoint_batch(cfg, origins, None)
            validate(cfg)
    for info in resolution.ignored:
        say(f"ignoring incomplete checkpoint {info.path} (its save did not finish)", console=console)
    if path is None:
        return resolution
    probe = cfg.copy()
    probe.run.dir = run_dir
    diff = check_resumable(old, probe, path)
    fast = tiers.local is not None and os.path.dirname(path) == tiers.local
    say(f"resuming from {path}" + (" (the fast tier, checkpoint.local_dir)" if fast else "")
        + (" with these changes:" if diff else " (same config)"), console=console)
    for key, before, after in diff:
        plain(f"  {key}: {describe_change(key, before, after)}", console=console)
    data = data_changes((store.read_meta(path) or {}).get("data"), cfg.data)
    if data:  # allowed here: a checkpoint of another run directory (or an older one) resumed on purpose
        plain(f"  {run_identity.data_key(cfg)}: other data than the checkpoint's: {data}", console=console)
    context = context_change(old, probe)
    if context:  # after the list it sums up
        say(context, console=console)
    return resolution


def finished_already(cfg: DictConfig, resolution: Resolution) -> str | None:
    """The trainer's `nothing to do` line when the checkpoint this launch resumes from is at its last step."""
    from llmtrain.checkpoint import store
    from llmtrain.train.run_end import nothing_to_do

    if resolution.checkpoint is None:
        return None
    step = (store.read_meta(resolution.checkpoint) or {}).get("step")
    return nothing_to_do(step, cfg.train) if isinstance(step, int) else None


def launch(cfg: DictConfig, origins: dict[str, str] | None = None) -> int:
    """`origins`: compose_here's, for the resume check and the launch record (where the global batch came from)."""
    console = get_console()
    run_dir = cfg.run.dir = os.path.abspath(cfg.run.dir)
    absolute_locations(cfg)  # config.yaml keeps them as every node reads them, whatever its working directory
    backend = get_backend(cfg, run_dir)
    backend.check_ready()  # missing tools or devices: refused before anything is written
    check_shapes(cfg)  # a run that accepts fewer nodes has a layout for each count
    check_tracker_stores(cfg)  # a store that would stall rank 0's start-up, as well
    check_checkpoint_store(cfg)
    check_init_from(cfg)
    existed = os.path.isdir(run_dir)
    lock = RunDirLock(run_dir)
    if backend.traits.queued:  # a queued job finds itself named in the lock when it starts
        backend.on_submitted = lock.name_job
    try:
        took_over = lock.acquire()
    except OSError as e:
        raise ConfigError("run.dir", f"cannot write the run directory {run_dir}: {e.strerror or e}") from None
    try:
        if took_over:
            say(took_over, console=console)
        prepare_data(cfg)  # first: the resume check compares the data it builds with the checkpoint's
        resolution = check_resume(cfg, console, origins)
        done = finished_already(cfg, resolution)
        if done:  # said before any worker starts; the run directory is left as it was
            plain(done, console=console)
            return EXIT_OK
        try:
            prepare_run_dir(cfg)  # checkpoint.resume as the user wrote it
            if cfg.checkpoint.get("dir"):  # from now on this run's: another is refused there
                claim(cfg.checkpoint.dir, run_dir)
        except OSError as e:
            raise ConfigError("run.dir", f"cannot write the run directory {run_dir}: {e.strerror or e}") from None
        return _run(cfg, backend, console, resolution, (origins or {}).get(batch.GLOBAL_KEY))
    except LlmtrainError:  # refused before the job started (a conflict, sbatch, the data cache, a damaged checkpoint)
        lock.release()
        if not existed:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    finally:
        job = backend.job_holding_run_dir()
        if job:
            lock.hand_to_job(job)
        lock.release()


def _run(cfg: DictConfig, backend, console, resolution: Resolution, batch_origin: str | None) -> int:
    # Recorded before the job starts, so `llmtrain status|follow|cancel RUN_DIR` find it from the start; completed
    # when the launcher returns: its exit code, and the Slurm job id (without cluster.follow the launcher returns
    # right after sbatch; a following launcher holds the lock itself until the job ends). The workers' first
    # start loads the checkpoint recorded here: the one this launcher announced.
    record = LaunchRecord.start(cfg, backend, resolution.to_record(), batch_origin)
    started = time.time()
    goodput.clear_events(cfg.run.dir)
    code = None
    # cluster=ssh on fewer nodes: a start per set of hosts that answer, each its own goodput entry.
    on_answering = elastic(cfg) and traits_of(cfg.cluster.name).resize == REACHABLE_HOSTS
    try:
        if on_answering:
            code = run_on_answering_hosts(cfg, console, record, lambda c, b: _start_and_follow(c, b, console, record))
        else:
            if backend.owns_processes:  # a queued job records each of its starts itself (shape/slurm_start.py)
                record.update(**record_facts(cfg, StartShape(cfg.cluster.nnodes), backend.host_names(),
                                             record.entry))
            code = _start_and_follow(cfg, backend, console, record)
        return code
    finally:
        record.ended(code, getattr(backend, "job_id", None))
        if backend.owns_processes and not on_answering:  # a Slurm job's starts are its own (the batch script's)
            record_start(cfg.run.dir, started, launch=record.entry["launch"])


def start_line(run_dir: str, dims: ParallelDims, nnodes: int, hosts: list[str], backend_name: str) -> str:
    """The launch's first line (README quotes it)."""
    on = f" ({', '.join(hosts)})" if hosts else ""
    return (f"llmtrain: run directory {run_dir}; {dims.world_size} ranks ({dims.degrees}) "
            f"on {nnodes} node(s){on}, backend {backend_name}")


def _start_and_follow(cfg: DictConfig, backend, console, record: LaunchRecord) -> int:
    run_dir = cfg.run.dir
    dims = ParallelDims.from_config(cfg)
    plain(start_line(run_dir, dims, cfg.cluster.nnodes, backend.host_names(), backend.name), console=console)
    monitor = Monitor(run_dir, cfg.train.max_steps, console, nnodes=cfg.cluster.nnodes,
                      max_restarts=cfg.launch.max_restarts, rendezvous_timeout_s=cfg.launch.rendezvous_timeout_s,
                      nproc_per_node=cfg.cluster.nproc_per_node, combined_log=backend.owns_processes,
                      # A Slurm job watches itself for hangs (slurm_hang_watch.py); its follower shows the verdict.
                      hang_timeout_s=cfg.launch.hang_timeout_s if backend.owns_processes else None,
                      hang_evidence_wait_s=cfg.launch.hang_evidence_wait_s)
    try:
        code = backend.run(monitor)
    except KeyboardInterrupt:
        stopping.interrupted(backend, run_dir, console)
        say(checkpoint_state(run_dir), console=console)
        return EXIT_INTERRUPTED
    except PreemptRequest as e:
        record.entry["signal"] = str(e)
        return preempt(backend, monitor, cfg, str(e))
    except HangDetected as e:  # the verdict is said and written: stop as for any failure
        record.entry["hang"] = str(e)
        stopping.stop_job(backend, run_dir, console)
        return EXIT_FAILED
    except RendezvousTimeout as e:  # no worker ever started: say where it waited, then stop
        say(str(e), console=console)
        stopping.stop_job(backend, run_dir, console)
        return EXIT_FAILED
    # A backend that can return before its job ends (a Slurm submission) says whether the job did.
    if code == 0 and getattr(backend, "finished_job", True):
        short = stopped_short(rank_statuses(run_dir))
        say(f"{short or 'job finished'}; metrics in {RunPaths(run_dir).metrics}", console=console)
    return code


def checkpoint_state(run_dir: str) -> str:
    """After a stop: which checkpoint the workers saved on their way out, else the one a relaunch resumes from."""
    from llmtrain.checkpoint import store
    from llmtrain.launch.supervision.failures import rank_statuses

    statuses = rank_statuses(run_dir)
    steps = {s.get("step") for s in statuses.values() if s.get("status") == "preempted"}
    path = resolve_resume(run_dir, "auto").checkpoint
    if steps and path is not None and (store.read_meta(path) or {}).get("step") == max(steps):
        return f"checkpoint step {max(steps)} saved in {path}; the same command resumes from it"
    if path is not None:
        return f"no checkpoint saved on the way out; the same command resumes from {path}"
    return "no checkpoint saved; the same command starts from step 0"


def preempt(backend, monitor, cfg: DictConfig, why: str) -> int:
    """Ask every worker to checkpoint at its next step boundary, wait for them, report. `why`: the signal's name
    (SIGHUP, a closed terminal, ends with its own line and exit code)."""
    console, run_dir = monitor.console, cfg.run.dir
    request = PreemptRequest(why)
    code_out = request.exit_code
    grace = cfg.launch.preempt_grace_s
    monitor.hangs = None  # no steps while the workers save: the grace bounds the wait instead
    for sig in stopping.PREEMPT_SIGNALS:  # asked once is enough; Ctrl-C still stops at once
        signal.signal(sig, signal.SIG_IGN)
    deadline = time.monotonic() + grace
    try:
        _wait_for_starting_workers(monitor, run_dir, why, grace)
    except KeyboardInterrupt:
        stopping.interrupted(backend, run_dir, console)
        say(checkpoint_state(run_dir), console=console)
        return EXIT_INTERRUPTED
    n = backend.signal_workers(signal.SIGUSR1)
    if n == 0:  # nothing can checkpoint: waiting the grace would only let workers start and train on
        say(f"{why}: no worker is running (none has started yet, or all have ended); stopping "
            "the job at once", console=console)
        stopping.stop_job(backend, run_dir, console)
        say(checkpoint_state(run_dir), console=console)
        return code_out
    say(f"{why}: asked {n} worker(s) to checkpoint and stop (up to {grace} s)", console=console)
    try:
        code = backend.follow(monitor, timeout_s=max(1.0, deadline - time.monotonic()))
    except KeyboardInterrupt:
        code = None
    stopping.stop_job(backend, run_dir, console)
    _report_preempted(console, run_dir, code, request.hangup)
    return code_out


def _wait_for_starting_workers(monitor, run_dir: str, why: str, grace: float) -> None:
    """Workers still starting would ignore the request (or die of it): ask once they can take it."""
    if stopping.starting_workers(run_dir, signal.SIGUSR1):
        say(f"{why}: the workers are still starting; asking them to checkpoint once "
            "they can", console=monitor.console)
        stopping.wait_for_workers(run_dir, signal.SIGUSR1, grace, monitor.poll)


def _report_preempted(console, run_dir: str, code: int | None, hangup: bool = False) -> None:
    from llmtrain.launch.supervision.failures import rank_statuses

    statuses = rank_statuses(run_dir)
    steps = {s.get("step") for s in statuses.values() if s.get("status") == "preempted"}
    confirmed = code == 0 and statuses and all(s.get("status") == "preempted" and s.get("saved", True)
                                               for s in statuses.values())
    if hangup:  # the terminal may be gone: job.json and `llmtrain status` keep what this says
        say(f"hangup (terminal closed): checkpointed at step {max(steps)}; the same command resumes" if confirmed
            else "hangup (terminal closed): the job did not confirm a checkpoint (see logs/); the same command "
                 "resumes from the newest complete checkpoint", console=console)
    elif confirmed:
        say(f"preempted at step {max(steps)}; checkpoint saved; the same command resumes", console=console)
    else:
        say("preempted; the job did not confirm a checkpoint (see logs/); resuming uses the "
            "newest complete checkpoint", console=console)
