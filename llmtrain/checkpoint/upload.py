"""The fast tier's background upload: every `checkpoint.upload_every`-th save to `checkpoint.local_dir` is copied to
`checkpoint.dir` by one thread of rank 0 while training goes on.

Shards first, meta.json (the local one: the same bytes, so the same manifest) last, so a cut-off upload is an
incomplete folder that resume never takes. A failed upload is retried with backoff and never stops training; the
local copy stays until its upload is committed (local retention holds it). A newer checkpoint waiting to go
replaces an older one still waiting: the store needs the newest, not every one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from llmtrain.checkpoint import store
from llmtrain.checkpoint.location import Tiers
from llmtrain.checkpoint.storage import storage_for

BACKOFF_S = (1, 2, 4, 8, 16, 30)  # then every 30 s
FINAL_TRIES = 8  # when the run ends: tries for the checkpoints still waiting, before giving up on them


class Uploader:
    def __init__(self, target: str, keep: int, log: Callable[..., None]):
        self.target, self.keep, self.log = target, keep, log
        self.storage = storage_for(target)
        self.waiting: tuple[str, int] | None = None  # (local folder, step) not started yet
        self.current: tuple[str, int] | None = None
        self.uploaded: list[int] = []
        self.submitted: set[int] = set()
        self.failed_tries = 0
        self.finishing = False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="llmtrain-upload", daemon=True)
        self.thread.start()

    def submit(self, local: str, step: int) -> None:
        with self.cond:
            if self.waiting is not None:
                self.log(f"llmtrain: checkpoint step {self.waiting[1]}: upload skipped, step {step} replaces it",
                         flush=True)
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
            finally:
                with self.cond:
                    self.current = None

    def _upload_with_retries(self, local: str, step: int) -> None:
        tries = 0
        while True:
            tries += 1
            try:
                remote, size, took = self._upload(local, step)
            except Exception as e:  # noqa: BLE001 - any failure of the store: said, retried, never fatal
                wait = BACKOFF_S[min(tries, len(BACKOFF_S)) - 1]
                with self.cond:
                    superseded = self.waiting is not None and not self.finishing
                    giving_up = self.finishing and tries >= FINAL_TRIES
                reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
                if superseded or giving_up:
                    self.log(f"llmtrain: warning: upload of checkpoint step {step} to {self.target} failed "
                             f"({tries} tries, last: {reason}); "
                             + ("a newer checkpoint goes instead" if superseded else "giving up")
                             + f"; the local copy stays at {local}", flush=True)
                    return
                self.log(f"llmtrain: warning: upload of checkpoint step {step} to {self.target} failed "
                         f"({reason}); retrying in {wait} s; the local copy stays at {local}", flush=True)
                time.sleep(wait)
                continue
            self.uploaded.append(step)
            removed = store.prune(self.target, self.keep, protect=remote)
            self.log(f"llmtrain: uploaded checkpoint step {step} -> {remote} ({size / 2**20:.1f} MiB, {took:.1f} s)"
                     + (f"; removed {len(removed)} old from the store" if removed else ""), flush=True)
            return

    def _upload(self, local: str, step: int) -> tuple[str, int, float]:
        t0 = time.perf_counter()
        remote = store.step_dir(Tiers(self.target), step)
        local_storage = storage_for(local)
        self.storage.remove(remote)  # the remains of an earlier try: no file of it may survive into this one
        files = sorted(local_storage.walk_files(local))
        size = 0
        for name, nbytes in files:
            if name != store.META:
                self.storage.put_file(local_storage.join(local, name), self.storage.join(remote, name))
                size += nbytes
        # The commit: the manifest, written last.
        self.storage.write_bytes(self.storage.join(remote, store.META),
                                 local_storage.read_bytes(local_storage.join(local, store.META)))
        return remote, size, time.perf_counter() - t0
