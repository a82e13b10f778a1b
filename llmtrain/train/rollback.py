"""What a loss spike does (train.spike.policy), and the rollback's mechanics: reload the newest checkpoint from
before the spike in the same processes (the trainer's own load path), skip the global samples from its position
through the spike step and train.spike.margin_steps more, and record the skipped range in the TrainingState (so
every later checkpoint carries it), RUN_DIR/spikes.json (at once, so a resume of an older checkpoint skips it too)
and metrics.jsonl (an event row). The sample stream is picked by the global sample offset (samples_seen), so moving
that offset is the whole skip, the same under any layout."""

from __future__ import annotations

from llmtrain.checkpoint import store
from llmtrain.rundir.paths import RunPaths
from llmtrain.rundir.spike_record import add_rollback, merged, read_rollbacks, skip_past
from llmtrain.train.fault_injection import loss_spike
from llmtrain.train.spike_rule import ROLLBACK, STOP, WARN, Spike, SpikeRule, action, skipped_range


class SpikeGuard:
    def __init__(self, cfg, run_dir: str, ckpt, state, log, rank: int, phase):
        """`ckpt`: the CheckpointManager, `state`: the TrainingState, `phase`: the heartbeat's phase context."""
        s = cfg.train.spike
        self.policy, self.margin, self.max_rollbacks = s.policy, s.margin_steps, s.max_rollbacks
        self.rule = SpikeRule(s.metric, s.window, s.sigma, admit_spikes=s.policy == WARN) if s.sigma is not None \
            else None
        self.global_batch = cfg.train.global_batch_size
        self.run_dir, self.ckpt, self.state, self.log, self.rank, self.phase = run_dir, ckpt, state, log, rank, phase
        self.fault = loss_spike()

    # ---- inside a step ---------------------------------------------------------------------------------------
    def inject(self, loss, params):
        """The injected spike of LLMTRAIN_INJECT_SPIKE, when this step's batch holds its sample."""
        return loss if self.fault is None else self.fault(self.state.samples_seen, self.global_batch, loss, params)

    def judge(self, step: int, loss, grad_norm, skipped: bool) -> Spike | None:
        """The rule's verdict on the globally reduced loss and grad norm (None without train.spike.sigma: then
        nothing is read back from the device)."""
        if self.rule is None:
            return None
        return self.rule.judge(step, float(loss), float(grad_norm), skipped)

    def applies(self, spike: Spike | None) -> bool:
        """Whether a step's update is applied: a spike's only under warn (it is known before optimizer.step)."""
        return spike is None or self.policy == WARN

    # ---- after a step ----------------------------------------------------------------------------------------
    def act(self, spike: Spike, metrics) -> bool:
        """A spike by policy: one line and train on (warn: False), a stop (raises), a rollback (True)."""
        line = f"step {spike.step}: {spike.metric} spike: {spike.rule()}"
        if self.policy == WARN:
            self.log(f"llmtrain: {line}; training on (train.spike.policy=warn)", flush=True)
            metrics.event({"step": spike.step, "event": "spike", "metric": spike.metric, "value": spike.value,
                           "why": spike.rule()})
            return False
        extra = {"metric": spike.metric, "value": spike.value, "why": spike.rule()}
        return self._roll_back(line, spike.step, spike.step, self.state.samples_seen, metrics, extra)

    def streak(self, error: RuntimeError, bad_since: int, metrics) -> None:
        """A streak of train.max_bad_steps non-finite steps (`error`: the trainer's stop, raised as a RuntimeError
        unless the policy is rollback). The skip runs through the streak's last step (just taken)."""
        if self.policy != ROLLBACK:
            raise RuntimeError(str(error)) from None  # the stop as it has always read
        step = self.state.step
        extra = {"metric": "non-finite", "value": None, "why": str(error).split(";")[0]}
        self._roll_back(f"step {step}: {extra['why']}", bad_since, step,
                        self.state.samples_seen - self.global_batch, metrics, extra)

    def _roll_back(self, line: str, first_step: int, step: int, spike_start: int, metrics, extra: dict) -> bool:
        """Back to the newest checkpoint before `first_step`, past the samples through `step` (which began at
        sample `spike_start`) and the margin; or a stop (policy stop, no checkpoint, the bound reached)."""
        state = self.state
        done = merged(state.skipped, read_rollbacks(self.run_dir))
        if action(self.policy, len(done), self.max_rollbacks) == STOP:
            bound = "" if self.policy == STOP else (f"; train.spike.max_rollbacks={self.max_rollbacks} reached "
                                                    f"({len(done)} rollback(s) in this run)")
            raise RuntimeError(f"{line}; stopping at step {step} without saving (train.spike.policy="
                               f"{self.policy}{bound})")
        self.ckpt.wait()  # a save in flight is a checkpoint from before the spike
        before = [i for i in store.list_checkpoints(self.run_dir) if i.resumable and i.step < first_step]
        if not before:
            raise RuntimeError(f"{line}; no checkpoint of this run before step {first_step} to roll back to; "
                               f"stopping at step {step} without saving (train.spike.policy=rollback)")
        n = len(done) + 1
        self.log(f"llmtrain: {line}; rolling back (rollback {n} of train.spike.max_rollbacks={self.max_rollbacks})",
                 flush=True)
        elapsed = state.elapsed_s()  # the run's training time goes on: the rolled-back steps took it too
        with self.phase("checkpoint"):
            self.ckpt.load(before[-1].path, f"rollback {n}: ")
        state.elapsed_before_s = elapsed
        state.restart_clock()
        start, end = skipped_range(state.samples_seen, spike_start, self.global_batch, self.margin)
        entry = {"step": step, "checkpoint_step": state.step, "start": start, "end": end, **extra}
        state.skipped = merged(done, [entry])
        state.samples_seen = skip_past(state.samples_seen, state.skipped)
        if self.rank == 0:
            add_rollback(self.run_dir, entry)
        metrics.event({**entry, "event": "rollback", "step": state.step, "spike_step": step},
                      rewind_to=state.step)
        self.log(f"llmtrain: rollback {n}: skipping samples {start:,}-{end - 1:,} ({end - start:,} samples: steps "
                 f"{state.step + 1}-{step} and train.spike.margin_steps={self.margin} more); training goes on "
                 f"from step {state.step} at sample {state.samples_seen:,}", flush=True)
        return True

    # ---- at a launch's start -----------------------------------------------------------------------------------
    def resumed(self) -> None:
        """After the launch's checkpoint load: every rollback of the run (the checkpoint's and spikes.json's) is
        known, and a position inside a skipped range (an older checkpoint) moves past it."""
        state = self.state
        state.skipped = merged(state.skipped, read_rollbacks(self.run_dir))
        moved = skip_past(state.samples_seen, state.skipped)
        if moved != state.samples_seen:
            self.log(f"llmtrain: skipping samples {state.samples_seen:,}-{moved - 1:,} (rolled back past a loss "
                     f"spike: {len(state.skipped)} rollback(s) in {RunPaths(self.run_dir).spikes})", flush=True)
            state.samples_seen = moved
