"""How long a checkpoint save blocks training with checkpoints on an S3-compatible object store, on CPU.

One process builds the real trainer (a gloo process group of one rank) and trains a few steps so AdamW's moments
exist; then, for each way of saving, a CheckpointManager configured as a launch would configure it saves the same
state, as the training loop calls it (Trainer.save_checkpoint):

- local:         checkpoint.dir on local disk, synchronous (the reference without a store);
- store:         checkpoint.dir=s3://BUCKET/..., synchronous: the whole upload blocks training (what (c) and (d) are
                 measured against);
- store async:   the same with checkpoint.async=true: blocked for the call and the wait for the background copy
                 before the next optimizer step; training goes on while the shards go up;
- fast tier:     checkpoint.local_dir (a folder here) in front of the store, checkpoint.upload_every=1: the local
                 save blocks, rank 0's upload thread copies it to the store while training goes on;
- fast + async:  the fast tier with checkpoint.async=true.

Each store checkpoint is checked complete afterwards (meta.json with every file at its size). The store is a moto
server (moto.server.ThreadedMotoServer) started by this script in a child process on loopback, or --endpoint URL
with the AWS credentials of the environment. Printed as one table; --out writes the figures as JSON.

  python scripts/bench_checkpoint_store.py [--model gpt-125m] [--repeats 1] [--endpoint URL] [--out FILE]
  python scripts/bench_checkpoint_store.py --quick      # gpt-tiny, seconds: what the test runs
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's llmtrain

TARGET = 0.10  # what (c) and (d) may block, as a fraction of the synchronous store save
MODES = ("local", "store", "store async", "fast tier", "fast + async")
# moto's credentials take any value; used only for the server this script starts.
MOTO_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
MOTO_MAIN = ("import sys; from moto.server import ThreadedMotoServer; "
             "s = ThreadedMotoServer(ip_address='127.0.0.1', port=int(sys.argv[1]), verbose=False); s.start(); "
             "sys.stdin.read(); s.stop()")


def start_moto() -> tuple[subprocess.Popen, str]:
    """A moto S3 server in a child process (its request handling does not share this process's GIL with the
    training being timed), starting while the trainer is built; it stops when its stdin closes."""
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", MOTO_MAIN, str(port)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # its request log
    return proc, f"http://127.0.0.1:{port}"


def wait_for_moto(proc: subprocess.Popen, endpoint: str) -> None:
    port = int(endpoint.rsplit(":", 1)[1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise SystemExit(f"bench_checkpoint_store: the moto server did not start on 127.0.0.1:{port} "
                     "(pip install 'moto[server]')")


def make_bucket(endpoint: str, bucket: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, use_listings_cache=False, skip_instance_cache=True)
    if not fs.exists(bucket):
        fs.mkdir(bucket)


def build_trainer(a, run_dir: str):
    import torch
    import torch.distributed as dist

    from llmtrain.config import compose_config
    from llmtrain.launch.config_probes import validate_here
    from llmtrain.train.trainer import Trainer

    cfg = compose_config([f"model={a.model}", f"model.seq_len={a.seq}", "train.micro_batch_size=1",
                          "train.global_batch_size=1", "train.max_steps=100000", "device=cpu", "data=synthetic",
                          "cluster.nproc_per_node=1", "checkpoint.resume=none", "checkpoint.keep=1",
                          f"run.dir={run_dir}", *a.overrides])
    validate_here(cfg)
    torch.manual_seed(cfg.train.seed)
    os.makedirs(run_dir, exist_ok=True)
    dist.init_process_group("gloo", init_method=f"file://{run_dir}/pg-store", rank=0, world_size=1)
    return Trainer(cfg, run_dir, torch.device("cpu"))


def manager_for(trainer, mode: str, where: dict):
    """A CheckpointManager for `mode` on the trainer's model, optimizer and state, configured as a launch would."""
    from omegaconf import OmegaConf, open_dict

    from llmtrain.checkpoint.manager import CheckpointManager

    cfg = copy.deepcopy(trainer.cfg)
    OmegaConf.set_readonly(cfg, False)
    with open_dict(cfg):
        cfg.checkpoint.dir = where["disk"] if mode == "local" else where["store"]
        cfg.checkpoint.local_dir = where["fast"] if mode.startswith("fast") else None
        cfg.checkpoint.upload_every = 1
        cfg.checkpoint.keep = 1
    return CheckpointManager(cfg, trainer.run_dir, where["log"], trainer.model, trainer.optimizer, trainer.state)


def step(trainer, ckpt) -> float:
    """One training step as the loop runs it (a step, then the checkpoint poll); its wall time."""
    start = time.perf_counter()
    trainer.train_step()
    trainer.state.step += 1
    ckpt.poll()
    return time.perf_counter() - start


def save_once(trainer, mode: str, where: dict) -> dict:
    """One save in `mode`: what it blocked, when its copy in the store was committed, the steps run meanwhile."""
    from llmtrain.checkpoint import store
    from llmtrain.checkpoint.location import Tiers

    ckpt = trainer.ckpt = manager_for(trainer, mode, where)
    step(trainer, ckpt)  # a new step number for this save's folder
    asynchronous = mode.endswith("async")
    waited = [0.0]
    wait_for_staging = ckpt.wait_for_staging

    def timed_wait() -> None:  # the loop waits here before the optimizer step: blocked too
        t0 = time.perf_counter()
        wait_for_staging()
        waited[0] += time.perf_counter() - t0

    ckpt.wait_for_staging = timed_wait
    at = trainer.state.step
    start = call = time.perf_counter()
    trainer.save_checkpoint(asynchronous=asynchronous)
    call = time.perf_counter() - call
    steps = []
    uploader = ckpt.fast.uploader if ckpt.fast is not None else None

    def busy() -> bool:
        """The save in flight, or its upload not committed yet (an upload given up is no longer held)."""
        if ckpt.pending is not None:
            return True
        return uploader is not None and at not in uploader.uploaded and bool(uploader.held())

    while busy():
        steps.append(step(trainer, ckpt))
    done = time.perf_counter() - start
    ckpt.wait_for_staging = wait_for_staging
    ckpt.finish()  # ends the upload thread (nothing is waiting by now)
    if ckpt.stager is not None:
        ckpt.stager.close()
    target = where["disk"] if mode == "local" else where["store"]
    path = store.step_dir(Tiers(target), at)
    try:
        meta = store.verify(path, crc=where["crc"])  # complete: meta.json, every file there at its size
    except store.CheckpointError as e:  # a save given up after its retries: said in the warnings above
        raise SystemExit(f"bench_checkpoint_store: {mode}: no complete checkpoint: {e}") from None
    return {"blocked_s": call + waited[0], "committed_s": done, "steps_during": len(steps),
            "step_s_during": statistics.median(steps) if steps else None,
            "bytes": sum(f["bytes"] for f in meta["files"].values()),
            # the shards alone: DCP's .metadata and config.yaml name the location, so their lengths differ
            "shard_bytes": sum(f["bytes"] for name, f in meta["files"].items() if name.endswith(".distcp")),
            "file_bytes": {name: f["bytes"] for name, f in sorted(meta["files"].items())}, "step": at, "path": path}


def log(lines: list[str], line: str) -> None:
    """The managers' log: kept; a warning (an upload retried) also said at once."""
    lines.append(line)
    if "warning" in line:
        print(line, file=sys.stderr, flush=True)


def probe_seconds(location: str) -> float:
    from llmtrain.checkpoint.storage.probe import why_unwritable

    t0 = time.perf_counter()
    problem = why_unwritable(location)
    if problem:
        raise SystemExit(f"bench_checkpoint_store: {problem}")
    return time.perf_counter() - t0


def table(results: dict) -> list[str]:
    sync = results["store"]["blocked_s"]
    lines = [f"{'mode':<14} {'blocks training':>16} {'of sync store':>14} {'in the store after':>19} "
             f"{'steps meanwhile':>16}"]
    for mode in MODES:
        r = results[mode]
        committed = "-" if mode == "local" else f"{r['committed_s']:.2f} s"
        lines.append(f"{mode:<14} {r['blocked_s']:>14.2f} s {r['blocked_s'] / sync:>13.1%} {committed:>19} "
                     f"{r['steps_during']:>16}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt-125m")
    p.add_argument("--seq", type=int, default=64, help="model.seq_len (short: steps stay around a second)")
    p.add_argument("--repeats", type=int, default=1, help="saves per mode (medians reported)")
    p.add_argument("--warmup", type=int, default=3, help="steps before the first save (AdamW state exists)")
    p.add_argument("--endpoint", default=None, help="an S3-compatible endpoint to use instead of starting moto "
                                                    "(credentials from the AWS environment)")
    p.add_argument("--bucket", default="docs-bench")
    p.add_argument("--read-timeout", type=float, default=600,
                   help="the S3 client's read timeout in seconds (botocore's default is 60; 0 keeps it): moto "
                        "assembles a large multipart upload in Python, which on a busy CPU can take longer, and "
                        "the client's retry of the completion then finds the upload gone")
    p.add_argument("--crc", action="store_true", help="also check every file's CRC32 in the store (downloads it)")
    p.add_argument("--quick", action="store_true", help="gpt-tiny, seq 32: seconds (the test)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--out", default=None, help="also write the figures to this JSON file")
    p.add_argument("overrides", nargs="*", help="more config overrides")
    a = p.parse_args()
    if a.quick:
        a.model, a.seq, a.warmup = "gpt-tiny", 32, 1
    if "fsspec" in sys.modules:
        raise SystemExit("bench_checkpoint_store: fsspec was imported before its settings were made")

    if a.read_timeout:  # fsspec reads FSSPEC_S3 when it is imported: before anything imports it
        os.environ["FSSPEC_S3"] = json.dumps({"config_kwargs": {"read_timeout": a.read_timeout}})
    server = None
    if a.endpoint is None:
        os.environ.update(MOTO_ENV)
        server, a.endpoint = start_moto()
    os.environ["AWS_ENDPOINT_URL"] = a.endpoint  # before llmtrain opens the store: its client reads it
    try:
        return run(a, server)
    finally:
        if server is not None:
            server.stdin.close()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()


def run(a, server: subprocess.Popen | None) -> int:
    import torch
    import torch.distributed as dist

    log_lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-store-", dir=a.workdir) as tmp:
        where = {"disk": os.path.join(tmp, "disk"), "fast": os.path.join(tmp, "fast"),
                 "store": f"s3://{a.bucket}/bench-{uuid.uuid4().hex[:8]}", "crc": a.crc,
                 "log": lambda *args, **_: log(log_lines, " ".join(map(str, args)))}
        trainer = build_trainer(a, os.path.join(tmp, "run"))
        if server is not None:
            wait_for_moto(server, a.endpoint)
        make_bucket(a.endpoint, a.bucket)
        n_params = sum(t.numel() for t in trainer.params)
        machine = f"{platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
        print(f"{a.model}: {n_params / 1e6:,.1f} M parameters (state ~{n_params * 12 / 2**30:.2f} GiB: fp32 weights "
              f"+ AdamW moments), seq {a.seq}, {machine}, torch {torch.__version__}, store {a.endpoint}, "
              f"(client read timeout {a.read_timeout or 60:g} s), {time.strftime('%Y-%m-%d')}", flush=True)
        probe = probe_seconds(where["store"])
        with contextlib.redirect_stdout(io.StringIO()):
            for _ in range(a.warmup):
                step(trainer, trainer.ckpt)
            runs = {mode: [] for mode in MODES}
            for i in range(a.repeats):
                for mode in MODES:
                    runs[mode].append(save_once(trainer, mode, where))
                    r = runs[mode][-1]
                    print(f"  repeat {i + 1}, {mode}: blocked {r['blocked_s']:.2f} s, in the store after "
                          f"{r['committed_s']:.2f} s", file=sys.stderr, flush=True)
        # Times are medians over the repeats; counts, sizes and paths are the last repeat's.
        results = {mode: {key: statistics.median(r[key] for r in rs) if key in ("blocked_s", "committed_s")
                          else rs[-1][key] for key in rs[-1]} for mode, rs in runs.items()}
        lines = table(results)
        print(f"\nmedians over {a.repeats} repeat(s); probe write before launch {probe:.2f} s")
        print("\n".join(lines))
        sync = results["store"]["blocked_s"]
        fractions = {mode: results[mode]["blocked_s"] / sync for mode in MODES}
        met = {mode: fractions[mode] <= TARGET for mode in ("store async", "fast tier", "fast + async")}
        print("target: blocked <= 10% of the synchronous store save: "
              + ", ".join(f"{m} {'met' if ok else 'not met'}" for m, ok in met.items()))
        warnings = [line for line in log_lines if "warning" in line]
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"model": a.model, "params": n_params, "seq": a.seq, "repeats": a.repeats,
                           "machine": machine, "torch": torch.__version__, "read_timeout_s": a.read_timeout,
                           "date": time.strftime("%Y-%m-%d"),
                           "probe_s": probe, "modes": results, "fraction_of_sync_store": fractions,
                           "target": TARGET, "target_met": met, "warnings": warnings}, f, indent=1)
        dist.destroy_process_group()
    return 1 if warnings else 0


if __name__ == "__main__":
    sys.exit(main())
