"""Saving and loading training state with torch.distributed.checkpoint (DCP), under any layout.

The state is layout-free: the model and its optimizer state by parameter name (`state.py`; DTensor shards, which
DCP reshards on load for another dp/tp/pp/zero layout or world size), the TrainingState (`training_state.py`: the
step, the data position, the loss scaler, a mixture's history), and each rank's RNG state. The manager is handed
the model, its optimizer and the TrainingState; a load restores them in place and touches nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from omegaconf import DictConfig, OmegaConf
from torch.distributed.checkpoint.api import CheckpointException

from llmtrain.checkpoint import save_failures, store
from llmtrain.checkpoint.location import LOCAL, STORE, Tiers, tiers_of_config
from llmtrain.checkpoint.storage import storage_for
from llmtrain.checkpoint.state import ModelState, OptimizerState
from llmtrain.checkpoint.training_state import TrainingState
from llmtrain.config import to_yaml
from llmtrain.config.derived import world_size
from llmtrain.data.identity import data_identity


def layout_of(cfg: DictConfig) -> dict:
    """The parallel layout recorded in meta.json (and compared with it on load)."""
    p = cfg.parallel
    layout = {"dp": p.dp, "tp": p.tp, "pp": p.pp, "zero": p.zero, "virtual_stages": p.virtual_stages,
              "world_size": world_size(cfg)}
    if p.get("ep", 1) > 1:  # only then: a checkpoint without expert parallel reads as before
        layout["ep"] = p.ep
    return layout


class CheckpointManager:
    def __init__(self, cfg: DictConfig, run_dir: str, log, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 state: TrainingState):
        """`model`: a ParallelModel (its stages in .parts) or one plain module. No learning-rate scheduler to
        save: the schedule is a function of the step (train/optim.py)."""
        self.cfg = cfg
        self.parts = getattr(model, "parts", [model])
        self.optimizer = optimizer
        self.state = state
        self.run_dir = run_dir
        self.tiers = tiers_of_config(cfg, run_dir)
        # Saves go to the fast tier when there is one, every upload_every-th of them up to checkpoint.dir.
        self.save_tier = LOCAL if self.tiers.local else STORE
        self.log = log
        self.rank = dist.get_rank()
        # Saves (async ones finish in a background thread) get their own gloo group, so their collectives never
        # interleave with training's on the default group.
        self.group = dist.new_group(backend="gloo")
        self.pending = None  # (future, tmp_path, step, elapsed_s, t0, state being written)
        self.staging = None  # the future of the background copy of an async save's state
        self.stager = None
        self.saved: tuple[str, int] | None = None  # (path, step) of the newest checkpoint loaded or saved
        # What this launch trains on (rank 0 writes meta.json), recorded in every checkpoint for the next launch.
        self.data = data_identity(cfg.data) if self.rank == 0 and cfg.get("data") is not None else None
        self.writer = None  # the counting writer of the save in flight (an object store's, the fast tier's)
        if self.rank == 0:
            self._remove_partials()
        self.fast = None
        if self.tiers.local:
            from llmtrain.checkpoint.fast_tier import FastTier

            self.fast = FastTier(self.tiers, cfg.checkpoint.keep, cfg.checkpoint.upload_every, cfg.train.max_steps,
                                 self.group, log, run_dir)

    def _remove_partials(self) -> None:
        """A launch starts with no save or upload in flight, so every partial folder is the leftover of a killed
        one."""
        removed = store.remove_partials(Tiers(self.tiers.store))  # the fast tier's: each node its own
        if removed:
            self.log(f"llmtrain: removed {len(removed)} partial checkpoint folder(s) left by saves that did not "
                     f"finish: {', '.join(os.path.basename(p) for p in removed)}", flush=True)

    @property
    def last_good(self) -> tuple[str, int] | None:
        """(path, step) of the newest checkpoint of this run: loaded, saved, or being saved in the background."""
        if self.pending is not None:
            return self.pending[1].removesuffix(".tmp"), self.pending[2]
        return self.saved

    # ---- state ----------------------------------------------------------------------------------------------
    def state_dict(self, for_load: bool = False, include_rng: bool = True, mixture: bool = True,
                   skipped: bool | None = None) -> dict:
        """`mixture`: include the data=mix history (a load asks for it only when the checkpoint has one), `skipped`
        the rolled-back sample ranges likewise. "extra" is a copy of the TrainingState as it is now: an async save
        writes it while training goes on."""
        out = {"model": ModelState(self.parts), "optim": OptimizerState(self.parts, self.optimizer, for_load),
               "extra": self.state.state_dict(mixture, skipped)}
        if include_rng:
            out["rng"] = {f"rank{self.rank}": torch.get_rng_state()}
        return out

    # ---- save ------------------------------------------------------------------------------------------------
    def save(self, asynchronous: bool) -> bool:
        """Whether the checkpoint was written (or, asynchronously, is on its way): a save to an object store that
        failed every try is not, and training goes on."""
        self.wait()  # one save in flight at a time
        step = self.state.step
        storage = storage_for(self.tiers.at(self.save_tier))
        tmp = storage.staged_name(store.step_dir(self.tiers, step, self.save_tier))
        if self.rank == 0:
            save_failures.remove_quietly(tmp)  # leftovers of a save that was killed
            storage.makedirs(tmp)
        dist.barrier(group=self.group)
        state = self.state_dict()
        elapsed = self.state.elapsed_s()
        t0 = time.perf_counter()
        with self._one_line_if_disk_full(tmp, step, state):
            if asynchronous:
                # The copy of the state to host memory runs in the background too: training goes on at once and
                # waits for the copy only before the optimizer changes the weights (wait_for_staging).
                response = dcp.async_save(state, **self._target(tmp), process_group=self.group,
                                          async_stager=self._stager())
                self.staging = response.staging_completion
                self.pending = (response.upload_completion, tmp, step, elapsed, t0, state)
                self.log(f"llmtrain: checkpoint step {step}: saving in the background", flush=True)
            elif self._save_with_retries(state, tmp, step):
                return self._finalize(tmp, step, elapsed, t0, state)
            else:
                return False
        return True

    def _target(self, tmp: str) -> dict:
        """Where DCP writes: a filesystem through torch's own writer (the manifest is read back); an object store,
        and the fast tier (whose other nodes' shards rank 0 may not see), through one that counts each file's bytes
        and CRC32 as they go out."""
        storage = storage_for(tmp)
        if self.fast is not None:
            self.writer = self.fast.writer(tmp)
        else:
            self.writer = None if storage.renames else storage.dcp_writer(tmp)
        return {"checkpoint_id": tmp} if self.writer is None else {"storage_writer": self.writer}

    def _save_with_retries(self, state: dict, tmp: str, step: int) -> bool:
        """A save to an object store that fails (throttled, cut off, the endpoint gone a while) is tried again
        after a pause; when every try failed, training goes on from the previous checkpoint, said in a warning,
        except at the last step, whose save must land. DCP gathers every rank's failure, so all ranks agree on
        each try. Returns whether the save was written."""
        tries = 1 if storage_for(tmp).renames else len(save_failures.STORE_BACKOFF_S) + 1
        for attempt in range(1, tries + 1):
            try:
                dcp.save(state, **self._target(tmp), process_group=self.group)
                return True
            except (Exception, CheckpointException) as e:  # DCP's gathered failures are BaseExceptions
                if tries == 1 or save_failures.disk_full(e):
                    raise
                self._store_failed(tmp, step, e, attempt, tries)
        return False

    def _store_failed(self, tmp: str, step: int, e: BaseException, attempt: int, tries: int) -> None:
        reason = save_failures.store_reason(e)
        if self.rank == 0:
            save_failures.remove_quietly(tmp)  # no half of it stays (without meta.json it is never resumed anyway)
        last = attempt >= tries
        if last and self.state.step >= self.cfg.train.max_steps:
            raise store.CheckpointError(tmp, f"the last step's checkpoint could not be written after {tries} tries "
                                             f"({reason})") from e
        if self.rank == 0:
            good = self.saved[0] if self.saved else "none yet"
            self.log(f"llmtrain: warning: checkpoint step {step} to {self.tiers.store} failed ({reason}); "
                     + ("training goes on, the next save tries again; the last good checkpoint: " + good if last
                        else f"retrying in {save_failures.STORE_BACKOFF_S[attempt - 1]} s"), flush=True)
        if not last:
            time.sleep(save_failures.STORE_BACKOFF_S[attempt - 1])
            if self.rank == 0:
                storage_for(tmp).makedirs(tmp)
            dist.barrier(group=self.group)

    def _stager(self):
        """One stager for the run: it keeps its host buffers, so later saves do not allocate them again."""
        if self.stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            cuda = torch.cuda.is_available() and self.cfg.device != "cpu"
            self.stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                       use_async_staging=True, use_non_blocking_copy=cuda))
        return self.stager

    def wait_for_staging(self) -> None:
        """Before the weights or optimizer state change: the background save must have copied them."""
        if self.staging is not None:
            self.staging.result()
            self.staging = None

    @contextlib.contextmanager
    def _one_line_if_disk_full(self, tmp: str, step: int, state: dict):
        """A full disk is one clear line (for the rank's status), not DCP's per-rank tracebacks; the partial
        folder goes (DCP has gathered every rank's failure, so no rank still writes into it), the previous
        checkpoint stays. torch.save's zip writer reports a full disk as a bare "unexpected pos" RuntimeError,
        so a failed save with less room left than this rank's part also counts."""
        try:
            yield
        except BaseException as e:
            if not save_failures.out_of_space(e, os.path.dirname(tmp), state):
                raise
            if self.rank == 0:
                storage_for(tmp).remove(tmp)
            raise RuntimeError(f"no space left on device writing checkpoint step {step} at {tmp}") from None

    def poll(self) -> None:
        """At a step boundary: finalize an async save once every rank's part is written."""
        if self.pending is None:
            return
        done = torch.tensor([1 if self.pending[0].done() else 0], dtype=torch.int32)
        # On the default group: the save's own group is busy in the background thread.
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if done.item():
            self.wait()

    def wait(self) -> None:
        if self.pending is None:
            return
        self.wait_for_staging()
        future, tmp, step, elapsed, t0, state = self.pending
        self.pending = None
        with self._one_line_if_disk_full(tmp, step, state):
            try:
                future.result()  # re-raises a failed write
            except (Exception, CheckpointException) as e:
                if storage_for(tmp).renames or save_failures.disk_full(e):
                    raise
                # Training has moved on since: this state cannot be written again, the next save is the retry.
                self._store_failed(tmp, step, e, 1, 1)
                return
            self._finalize(tmp, step, elapsed, t0, state)

    def _finalize(self, tmp: str, step: int, elapsed: float, t0: float, state: dict) -> bool:
        # Complete only when every rank has written its part: then rank 0 seals the folder (with a fast tier on
        # each node's own disk, every node its own).
        written = self._written_by_every_rank()
        meta = final = failure = None
        if self.rank == 0:
            try:
                storage = storage_for(tmp)
                storage.write_bytes(storage.join(tmp, "config.yaml"), to_yaml(self.cfg).encode())
                meta = self._meta(step, elapsed, state)
                if self.fast is None:
                    final = store.finalize(tmp, meta, written)
            except Exception as e:  # every rank must learn of it, or they wait for rank 0 forever
                failure = e
        if self._sealing_failed(tmp, step, failure):
            return False
        added = ""
        if self.fast is not None:
            final, added = self.fast.seal(tmp, meta, written)
        if self.rank == 0:
            size = sum(v["bytes"] for v in store.read_meta(final)["files"].values())
            if self.fast is None:
                removed = store.prune(self.tiers, self.cfg.checkpoint.keep, protect=final)
                added = f"; removed {len(removed)} old" if removed else ""
            self.log(f"llmtrain: saved checkpoint step {step} -> {final} ({size / 2**20:.1f} MiB, "
                     f"{time.perf_counter() - t0:.1f} s){added}", flush=True)
        dist.barrier(group=self.group)
        self.saved = (tmp.removesuffix(".tmp"), step)
        return True

    def _sealing_failed(self, tmp: str, step: int, failure: Exception | None) -> bool:
        """Collective: whether rank 0 failed to seal the save. On an object store the save is then one that did
        not land (a warning, training goes on); on a filesystem every rank stops, rank 0 with its own error."""
        box = [None if failure is None else save_failures.store_reason(failure)]
        dist.broadcast_object_list(box, src=0, group=self.group)
        if box[0] is None:
            return False
        if not storage_for(tmp).renames:
            self._store_failed(tmp, step, failure or RuntimeError(box[0]), 1, 1)
            return True
        if failure is not None:
            raise failure
        raise store.CheckpointError(tmp, f"rank 0 could not seal the checkpoint ({box[0]})")

    def _meta(self, step: int, elapsed: float, state: dict) -> dict:
        """meta.json but its manifest."""
        mixture = state["extra"].get("mixture")
        skipped = state["extra"].get("skipped")  # loss-spike rollbacks: a load asks for them by this key
        return {**({"mixture": json.loads(mixture)} if mixture else {}),
                **({"skipped": json.loads(skipped)} if skipped else {}),
                "step": step, "complete": True, "layout": layout_of(self.cfg),
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                # training time of the whole run up to this step, over every launch
                "elapsed_s": round(elapsed, 3),
                # plain values: model.rope_scaling is a section of its own
                "model": OmegaConf.to_container(self.cfg.model, resolve=True),
                "data": self.data}

    def _written_by_every_rank(self) -> dict | None:
        """What every rank's writer counted (an object store's save, the fast tier's), gathered on rank 0; None
        where rank 0 reads the files back. Also the barrier after which every rank's part is written."""
        mine = self.writer.written if self.writer is not None else None
        if mine is None:
            dist.barrier(group=self.group)
            return None
        every = [None] * dist.get_world_size(self.group) if self.rank == 0 else None
        dist.gather_object(mine, every, dst=0, group=self.group)
        return {name: entry for part in every for name, entry in part.items()} if self.rank == 0 else None

    def finish(self) -> None:
        """When the run ends or is preempted: the save in flight, then the fast tier's uploads."""
        self.wait()
        if self.fast is not None:
            self.fast.finish()

    # ---- load ------------------------------------------------------------------------------------------------
    def _readable_by_every_rank(self, path: str) -> str:
        """Collective. A fast-tier checkpoint is loaded only where every rank sees it whole (a folder every node
        sees, or a one-node run on the node that wrote it); otherwise the store's newest complete one."""
        if self.tiers.local is None or storage_for(path).parent(path) != self.tiers.local:
            return path
        meta = store.read_meta(path) or {}
        whole = torch.tensor([int(bool(meta) and set(meta.get("files", {})) <= set(storage_for(path).sizes(path)))])
        dist.all_reduce(whole, op=dist.ReduceOp.MIN, group=self.group)
        if whole.item():
            return path
        instead, _ = store.latest_complete(Tiers(self.tiers.store))
        if instead is None:
            raise store.CheckpointError(path, "not on every node's disk (checkpoint.local_dir), and "
                                              f"{self.tiers.store} holds no complete checkpoint to resume instead")
        if self.rank == 0:
            self.log(f"llmtrain: {path} is not on every node's disk (checkpoint.local_dir); resuming from "
                     f"{instead.path} instead", flush=True)
        return instead.path

    def load(self, path: str, prefix: str = "") -> None:
        """Restore the model, optimizer and TrainingState from the checkpoint at `path`; `prefix` starts the log
        line (a restart's number)."""
        path = self._readable_by_every_rank(path)
        meta = store.verify(path, crc=False)
        same_layout = meta.get("layout") == layout_of(self.cfg)
        state = self.state_dict(for_load=True, include_rng=same_layout, mixture="mixture" in meta,
                                skipped="skipped" in meta)
        storage = storage_for(path)
        try:
            dcp.load(state, storage_reader=storage.dcp_reader(path), process_group=self.group)
        except (Exception, CheckpointException) as e:
            rank, cause = save_failures.unwrapped(e)
            text = str(cause).strip()
            raise store.CheckpointError(path, f"cannot load checkpoint: {rank}{type(cause).__name__}: "
                                              f"{text.splitlines()[0] if text else ''}") from e
        training = self.state
        training.load_state_dict(state["extra"])  # DCP loaded the checkpoint's values into this dict
        training.elapsed_before_s = float(meta.get("elapsed_s", 0.0))
        if training.new_mixture_segment:
            self.log(f"llmtrain: data.sources weights differ from the checkpoint's: a new mixture segment starts at "
                     f"sample {training.samples_seen:,} (nothing already drawn is drawn again)", flush=True)
        self.saved = (path, training.step)
        if same_layout:
            torch.set_rng_state(state["rng"][f"rank{self.rank}"])
        else:
            # Another layout: ranks map to other work, so reseed from (seed, step, rank) instead.
            torch.manual_seed(self.cfg.train.seed + 1_000_003 * training.step + self.rank)
        seq_len = self.cfg.model.get("seq_len")
        saved_len = (meta.get("model") or {}).get("seq_len", seq_len)
        self.log(f"llmtrain: {prefix}resumed from {path} at step {training.step} ({training.samples_seen:,} samples "
                 "seen)"
                 + ("" if same_layout else f"; resharded from layout {meta.get('layout')} to {layout_of(self.cfg)}")
                 # the stream is counted in samples: the next one is sample samples_seen, at the new length
                 + ("" if saved_len == seq_len else f"; model.seq_len {saved_len} -> {seq_len}: samples from "
                                                    f"{training.samples_seen:,} on are {seq_len} tokens"),
                 flush=True)
