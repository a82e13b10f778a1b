"""The fast tier: saves go to `checkpoint.local_dir`, every `checkpoint.upload_every`-th of them up to
`checkpoint.dir` in the background (upload.py).

`local_dir` is either one folder every rank sees (a one-node run's local disk, a scratch filesystem) or each node's
own disk; which one is found out at start-up, each node leaving a mark there that the others look for. On node-local
disks each node holds only its own ranks' shards: every node seals its folder with the same meta.json, uploads its
part itself and prunes its own copies; such folders are whole on no node, so resume takes the store's copy. In a
shared folder rank 0 does all of it, and a resume may read the folder itself.
"""

from __future__ import annotations

import os
import time
import uuid
import zlib

import torch
import torch.distributed as dist

from llmtrain.checkpoint import store
from llmtrain.checkpoint.location import LOCAL, Tiers
from llmtrain.checkpoint.ownership import claim, other_run
from llmtrain.checkpoint.storage import storage_for
from llmtrain.checkpoint.storage.dcp_io import counting_local_writer
from llmtrain.checkpoint.upload import Uploader

MARK = ".llmtrain-node-"


def _appears(storage, path: str, tries: int = 3) -> bool:
    """Whether another node's mark is here, asked by name and a few times: a network filesystem's cached listing
    can hide a file another client has just written."""
    for attempt in range(tries):
        if storage.isfile(path):
            return True
        if attempt + 1 < tries:
            time.sleep(0.5)
    return False


class FastTier:
    def __init__(self, tiers: Tiers, keep: int, upload_every: int, max_steps: int, group, log, run_dir: str):
        self.tiers, self.keep, self.upload_every, self.max_steps, self.log = tiers, keep, upload_every, max_steps, log
        self.group = group
        self.rank = dist.get_rank()
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.node = int(os.environ.get("GROUP_RANK", 0))
        self.nnodes = dist.get_world_size() // int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
        self.shared = self._one_folder_for_every_node()
        # Who seals, prunes and uploads a node's folder: rank 0 alone for a shared one, else each node's first rank.
        self.owner = self.rank == 0 if self.shared else self.local_rank == 0
        self.saves = 0
        self.newest: tuple[str, int] | None = None
        self.uploader = None
        if self.owner:
            self._claim(os.path.abspath(run_dir))
            self._remove_partials()
            self.uploader = Uploader(tiers.store, keep, log, node=0 if self.shared else self.node,
                                     nodes=1 if self.shared else self.nnodes)

    def _one_folder_for_every_node(self) -> bool:
        if self.nnodes == 1:
            return True
        storage = storage_for(self.tiers.local)
        storage.makedirs(self.tiers.local)
        mark = f"{MARK}{self.node}-{uuid.uuid4().hex[:8]}" if self.local_rank == 0 else None
        if mark:
            storage.write_bytes(storage.join(self.tiers.local, mark), b"")
        marks: list = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(marks, mark, group=self.group)  # also the barrier after every mark is written
        shared = torch.tensor([int(all(_appears(storage, storage.join(self.tiers.local, m)) for m in marks if m))],
                              dtype=torch.int32)
        dist.all_reduce(shared, op=dist.ReduceOp.MIN, group=self.group)
        dist.barrier(group=self.group)
        if mark:
            storage.remove(storage.join(self.tiers.local, mark))
        return bool(shared.item())

    def _claim(self, run_dir: str) -> None:
        """Two runs sharing one fast-tier folder would prune each other's saves: refused, naming the other."""
        why = other_run(self.tiers.local, run_dir)
        if why:
            raise store.CheckpointError("checkpoint.local_dir", why)
        claim(self.tiers.local, run_dir)

    def _remove_partials(self) -> None:
        removed = store.remove_partials(Tiers(self.tiers.local))  # this node's folder only: no upload runs yet
        if removed:
            self.log(f"llmtrain: removed {len(removed)} partial checkpoint folder(s) from checkpoint.local_dir: "
                     f"{', '.join(os.path.basename(p) for p in removed)}", flush=True)

    def writer(self, tmp: str):
        return counting_local_writer(tmp)

    def seal(self, tmp: str, meta: dict | None, written: dict | None) -> tuple[str, str]:
        """Collective. Rank 0 brings `meta` and every rank's `written` files; every owner seals its node's folder
        with the same meta.json, hands it to its uploader when due and prunes its node's copies. Returns (the
        folder, what rank 0's log line adds)."""
        if self.rank == 0:
            storage = storage_for(tmp)
            config = storage.read_bytes(storage.join(tmp, "config.yaml"))
            files = {**written, "config.yaml": {"bytes": len(config), "crc32": zlib.crc32(config)}}
            meta = dict(meta, files=dict(sorted(files.items())))
        box = [meta]
        dist.broadcast_object_list(box, src=0, group=self.group)
        step, final, added = box[0]["step"], tmp.removesuffix(".tmp"), ""
        self.saves += 1
        if self.owner:
            final = store.seal(tmp, box[0])
            self.newest = (final, step)
            if self.saves % self.upload_every == 0 or step >= self.max_steps:
                self.uploader.submit(final, step)
                added = f"; uploading to {self.tiers.store} in the background"
            removed = store.prune(self.tiers, self.keep, protect=final, tier=LOCAL, hold=self.uploader.held())
            added = (f"; removed {len(removed)} old" if removed else "") + added
        dist.barrier(group=self.group)
        return final, added

    def finish(self) -> None:
        """At the end or on preemption: the newest local save goes up too, whatever upload_every says (a start on
        other nodes reads only the store), then every upload waiting is done or given up."""
        if self.uploader is None:
            return
        if self.newest and self.newest[1] not in self.uploader.submitted:
            if self.rank == 0:
                self.log(f"llmtrain: checkpoint step {self.newest[1]}: uploading to {self.tiers.store} before "
                         "exiting", flush=True)
            self.uploader.submit(*self.newest)
        self.uploader.finish()
