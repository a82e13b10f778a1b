"""What `llmtrain launch --dry-run` says about a data=mix mixture: each source's name, path, tokens and weight, and
how many epochs of it train.max_steps would draw, with a warning for a source repeated too often."""

from __future__ import annotations

from omegaconf import DictConfig

from llmtrain.data.mixture import MixtureSchedule
from llmtrain.data.mixture_checks import check_mixture
from llmtrain.data.tokenfile import num_windows, split_sizes

# Past this many passes over a source's training split, the run mostly relearns the same samples.
MAX_EPOCHS = 4.0


def mixture_lines(cfg: DictConfig) -> list[str]:
    """One line for the mixture, one per source, then a warning line per source drawn more than MAX_EPOCHS
    times. A source's samples are model.seq_len+1 tokens at stride seq_len; its share of each step's
    train.global_batch_size samples is what the sample stream draws (its weight over the sum of the weights)."""
    sources = check_mixture(cfg)
    t, seq_len = cfg.train, cfg.model.seq_len
    samples = t.max_steps * t.global_batch_size
    lines = [f"data=mix: {len(sources)} source(s); train.max_steps={t.max_steps} x {t.global_batch_size} samples of "
             f"{seq_len} tokens = {samples:,} samples"]
    width = max(len(s.name) for s in sources)
    warnings = []
    # The samples each source gives a run that starts at step 0: the stream's own counts.
    drawn_samples = MixtureSchedule.fresh({s.name: s.weight for s in sources}).consumed(samples)
    for s in sources:
        train_tokens, _ = split_sizes(s.facts.num_tokens, cfg.data.val_fraction)
        drawn = drawn_samples[s.name]
        epochs = drawn / num_windows(train_tokens, seq_len)  # >= 1 window: checked before
        shards = f", {len(s.facts.files)} shards" if len(s.facts.files) > 1 else ""
        lines.append(f"  {s.name:<{width}}  {s.path} ({s.facts.num_tokens:,} tokens {s.facts.dtype}{shards})  "
                     f"weight {s.weight:g} ({100 * s.share:.1f}%)  {drawn * seq_len:,} tokens drawn = "
                     f"{epochs:.2f} epochs")
        if epochs > MAX_EPOCHS:
            warnings.append(f"warning: source {s.name} would be repeated {epochs:.1f} times (more than "
                            f"{MAX_EPOCHS:g} epochs of its {train_tokens:,} training tokens) in "
                            f"train.max_steps={t.max_steps}; add data to it or lower its weight")
    return lines + warnings
