"""The fast tier's background upload: every `checkpoint.upload_every`-th save to `checkpoint.local_dir` is copied to
`checkpoint.dir` by a thread while training goes on: one thread per node when each node has its own local disk
(each uploads the shards its node wrote), one on rank 0 when the folder is shared.

Shards first, meta.json last: every node's uploader leaves a marker (`.uploaded-nodeN`) once its files are in the
store, and node 0's, once every node's marker is there, writes meta.json (the manifest written locally, the same
bytes) and removes the markers. A cut-off or half-done upload is an incomplete folder that resume never takes. A
failed upload is retried with backoff and never stops training; the local copy stays until its upload is committed
(local retention holds it). A newer checkpoint waiting to go replaces an older one not yet committed: the store
needs the newest, not every one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from llmtrain.checkpoint import store
from llmtrain.checkpoint.location import Tiers
from llmtrain.checkpoint.storage import storage_for
from llmtrain.checkpoint.storage.failures import describe

BACKOFF_S = (1, 2, 4, 8, 16, 30)  # then every 30 s
FINAL_TRIES = 8  # when the run ends: tries for the checkpoints still waiting, before giving up on them
MARKER = ".uploaded-node"
POLL_S = 1.0  # node 0 looking for the other nodes' markers


class Superseded(Exception):
    """A newer checkpoint is waiting: this one is left uncommitted."""


class Uploader:
    def __init__(self, target: str, keep: int, log: Callable[..., None], node: int = 0, nodes: int = 1):
        self.target, self.keep, self.log = target, keep, log
        self.node, self.nodes = node, nodes  # this uploader's node, and how many upload (1: a shared folder)
        self.storage = storage_for(target)
        self.waiting: tuple[str, int] | None = None  # (local folder, step) not started yet
        self.current: tuple[str, int] | None = None
        self.uploaded: list[int] = []
        self.submitted: set[int] = set()
        self.finishing = False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="llmtrain-upload", daemon=True)
        self.thread.start()

    def submit(self, local: str, step: int) -> None:
        with self.cond:
            if self.waiting is not None:
                self._say(f"checkpoint step {self.waiting[1]}: upload skipped, step {step} replaces it")
            self.waiting = (local, step)
            self.submitted.add(step)
            self.cond.notify()

    def held(self) -> tuple[str, ...]:
        """Local folders that must stay: waiting for, or in, their upload."""
        with self.cond:
            return tuple(p for p, _ in filter(None, (self.waiting, self.current)))

    def finish(self) -> None:
        """At the end of the run: the checkpoints still waiting go up, each with FINAL_TRIES tries."""
        with self.cond:
            self.finishing = True
            self.cond.notify()
        self.thread.join()

    def _say(self, line: str) -> None:
        self.log(f"llmtrain: {line}", flush=True)

    def _newer_waiting(self) -> bool:
        with self.cond:
            return self.waiting is not None and not self.finishing

    def _run(self) -> None:
        while True:
            with self.cond:
                while self.waiting is None and not self.finishing:
                    self.cond.wait()
                if self.waiting is None:
                    return
                self.current, self.waiting = self.waiting, None
            local, step = self.current
            try:
                self._upload_with_retries(local, step)
            except Exception as e:  # noqa: BLE001 - the thread outlives any one checkpoint's trouble
                self._say(f"warning: upload of checkpoint step {step} to {self.target} stopped ({describe(e)}); "
                          f"the local copy stays at {local}")
            finally:
                with self.cond:
                    self.current = None

    def _upload_with_retries(self, local: str, step: int) -> None:
        tries = 0
        while True:
            tries += 1
            try:
                committed = self._upload(local, step)
            except Superseded:
                self._say(f"checkpoint step {step}: not committed to {self.target}, a newer checkpoint goes instead")
                return
            except Exception as e:  # noqa: BLE001 - any failure of the store: said, retried, never fatal
                wait = BACKOFF_S[min(tries, len(BACKOFF_S)) - 1]
                superseded, giving_up = self._newer_waiting(), self.finishing and tries >= FINAL_TRIES
                reason = describe(e)
                if superseded or giving_up:
                    self._say(f"warning: upload of checkpoint step {step} to {self.target} failed ({tries} tries, "
                              f"last: {reason}); " + ("a newer checkpoint goes instead" if superseded else
                                                      "giving up") + f"; the local copy stays at {local}")
                    return
                self._say(f"warning: upload of checkpoint step {step} to {self.target} failed ({reason}); "
                          f"retrying in {wait} s; the local copy stays at {local}")
                time.sleep(wait)
                continue
            self.uploaded.append(step)
            if committed:
                self._after_commit(step, *committed)
            return

    def _after_commit(self, step: int, remote: str, size: int, took: float) -> None:
        """Tidying once the checkpoint is committed: a failure here is a warning, never a retry of the upload
        (which would take the commit back)."""
        part = "this node's " if self.nodes > 1 else ""
        line = f"uploaded checkpoint step {step} -> {remote} ({part}{size / 2**20:.1f} MiB, {took:.1f} s)"
        try:
            for node in range(self.nodes if self.nodes > 1 else 0):
                self.storage.remove(self.storage.join(remote, f"{MARKER}{node}"))
            removed = store.prune(Tiers(self.target), self.keep, protect=remote)
        except Exception as e:  # noqa: BLE001
            self._say(f"{line}; warning: tidying the store afterwards failed ({describe(e)})")
            return
        self._say(line + (f"; removed {len(removed)} old from the store" if removed else ""))

    def _upload(self, local: str, step: int) -> tuple[str, int, float] | None:
        """This node's files, then its marker; node 0 then commits. Returns (folder, bytes, seconds) where this
        uploader committed, else None."""
        t0 = time.perf_counter()
        remote = store.step_dir(Tiers(self.target), step)
        # On a filesystem the upload goes to STEP.tmp, renamed once committed; on an object store to STEP itself.
        staged = self.storage.staged_name(remote)
        local_storage = storage_for(local)
        if self.node == 0:
            # An earlier commit of this step (a run resumed from before it) must not vouch for the files going up.
            self.storage.remove(self.storage.join(staged, store.META))
        self.storage.makedirs(staged)
        size = 0
        for name, nbytes in sorted(local_storage.walk_files(local)):
            if name != store.META:
                self.storage.put_file(local_storage.join(local, name), self.storage.join(staged, name))
                size += nbytes
        if self.nodes > 1:
            self.storage.write_bytes(self.storage.join(staged, f"{MARKER}{self.node}"), b"")
            if self.node != 0:
                return None
            self._wait_for_markers(staged, step)
        # The commit: the manifest, written last (then, on a filesystem, the rename).
        self.storage.write_bytes(self.storage.join(staged, store.META),
                                 local_storage.read_bytes(local_storage.join(local, store.META)))
        self.storage.publish(staged, remote)
        return remote, size, time.perf_counter() - t0

    def _wait_for_markers(self, remote: str, step: int) -> None:
        """Until every node's files are in the store; given up for a newer checkpoint, or at the end after the
        time FINAL_TRIES tries would take."""
        deadline = None
        while True:
            present = {name for name in self.storage.sizes(remote) if name.startswith(MARKER)}
            if len(present) >= self.nodes:
                return
            if self._newer_waiting():
                raise Superseded(step)
            if self.finishing:
                deadline = deadline or time.monotonic() + sum(BACKOFF_S[: FINAL_TRIES]) + 30 * max(
                    0, FINAL_TRIES - len(BACKOFF_S))
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.nodes)) - {int(n[len(MARKER):]) for n in present})
                    raise TimeoutError(f"node(s) {missing} never finished uploading their part of step {step}")
            time.sleep(POLL_S)
