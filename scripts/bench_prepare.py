"""Throughput of `llmtrain data prepare` (MB of input text per second) byte-level and with a BPE tokenizer, for 1
and 2 worker processes: the median of 3 runs each, and the speed-up of 2 workers over 1.

The corpus is generated (seeded, no download) in a temp folder: Zipf-distributed words made of syllables, sentences
and paragraphs, in --files files of about --file-mb MB; with --layout jsonl.gz the same paragraphs are one document
each in a single .jsonl.gz file (which the workers share: one reader cuts it into chunks). The BPE tokenizer (vocab
8192, byte-level pre-tokenizer, <|endoftext|>) is trained with `tokenizers` on the first two files. Each run is `python -m llmtrain data prepare`;
its MB/s is the one its summary line reports (the preparation itself, not Python's start-up), and "cores busy" the
CPU seconds it and its workers used per wall-clock second (start-up included): on a machine shared with other
jobs, 2 workers can only be faster where they got more than one core.

    python scripts/bench_prepare.py [--files 48] [--file-mb 1] [--runs 3] [--workers 1 2] [--layout jsonl.gz]
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import random
import resource
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SYLLABLES = ["ka", "to", "ri", "ne", "sa", "mo", "lu", "pe", "di", "an", "er", "in", "on", "th", "st", "ch", "qu",
             "el", "or", "is", "ve", "ga", "bo", "wi"]
SPEED = re.compile(r"([\d,.]+) MB of text in ([\d.]+) s \(([\d,.]+) MB/s, (\d+) workers?\)")


def make_corpus(folder: Path, files: int, file_mb: float, seed: int = 1234) -> int:
    rng = random.Random(seed)
    vocab = sorted({"".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))) for _ in range(30_000)})
    rng.shuffle(vocab)
    cum_weights = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(vocab))))  # Zipf's law
    total = 0
    for i in range(files):
        paragraphs, size = [], 0
        while size < file_mb * 1e6:
            sentences = []
            for _ in range(rng.randint(2, 7)):
                words = rng.choices(vocab, cum_weights=cum_weights, k=rng.randint(5, 24))
                words[0] = words[0].capitalize()
                if rng.random() < 0.2:
                    words.insert(rng.randint(1, len(words) - 1), f"{rng.randint(0, 2099)},")
                sentences.append(" ".join(words) + rng.choice(".....?!;"))
            paragraph = " ".join(sentences)
            paragraphs.append(paragraph)
            size += len(paragraph) + 2
        data = ("\n\n".join(paragraphs) + "\n").encode()
        (folder / f"part{i:03d}.txt").write_bytes(data)
        total += len(data)
    return total


def make_jsonl_gz(corpus: Path, path: Path) -> int:
    """The corpus's paragraphs, one {"text": ...} line each, in one gzip file; returns the bytes of its text."""
    total = 0
    with gzip.open(path, "wb", compresslevel=6) as out:
        for part in sorted(corpus.iterdir()):
            for paragraph in part.read_text().split("\n\n"):
                line = (json.dumps({"text": paragraph.strip()}) + "\n").encode()
                out.write(line)
                total += len(line)
    return total


def train_bpe(corpus: Path, path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(p) for p in sorted(corpus.iterdir())[:2]], trainer)
    tok.save(str(path))


def load() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(corpus: Path, out: Path, workers: int, tokenizer: Path | None) -> tuple[float, float]:
    """(MB/s from the summary line, cores used: CPU seconds of the command and its workers per wall second);
    `corpus` is the folder of files, or the one .jsonl.gz."""
    cmd = [sys.executable, "-m", "llmtrain", "data", "prepare", "--input", str(corpus), "--output", str(out),
           "--workers", str(workers)] + (["--tokenizer", str(tokenizer)] if tokenizer else [])
    cpu, started = children_cpu(), time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True)
    cores = (children_cpu() - cpu) / (time.perf_counter() - started)
    if result.returncode != 0:
        sys.exit(f"bench_prepare: {' '.join(cmd)} failed:\n{result.stderr}")
    match = SPEED.search(result.stdout)
    if not match:
        sys.exit(f"bench_prepare: no MB/s in the summary: {result.stdout!r}")
    if int(match.group(4)) != workers:
        sys.exit(f"bench_prepare: asked for {workers} workers, the command ran {match.group(4)}: {result.stdout!r}")
    return float(match.group(3).replace(",", "")), cores


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=48)
    parser.add_argument("--file-mb", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--layout", choices=("files", "jsonl.gz"), default="files",
                        help="the corpus as --files text files, or as one .jsonl.gz of the same paragraphs")
    parser.add_argument("--dir", default=None, help="folder for the corpus and outputs (default: a temp folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-prepare-") as tmp:
        root = Path(tmp)
        corpus = root / "corpus"
        corpus.mkdir()
        started = time.perf_counter()
        size = make_corpus(corpus, args.files, args.file_mb)
        tokenizer = root / "tokenizer.json"
        train_bpe(corpus, tokenizer)
        what = f"{args.files} files"
        if args.layout == "jsonl.gz":
            one = root / "corpus.jsonl.gz"
            size = make_jsonl_gz(corpus, one)
            what = f"one .jsonl.gz of {one.stat().st_size / 1e6:.1f} MB ({size / 1e6:.1f} MB of text)"
            corpus = one
        print(f"corpus: {what}, {size / 1e6:.1f} MB; BPE vocab 8192 trained "
              f"({time.perf_counter() - started:.1f} s for both); cores: {os.cpu_count()}; load before: {load()}")
        rows = []
        for name, tok in (("byte-level", None), ("BPE 8192", tokenizer)):
            medians = {}
            for workers in args.workers:
                runs = [run_once(corpus, root / "out.bin", workers, tok) for _ in range(args.runs)]
                speeds = [speed for speed, _ in runs]
                medians[workers] = statistics.median(speeds)
                cores = statistics.median(c for _, c in runs)
                rows.append((name, workers, medians[workers], cores, medians[workers] / medians[args.workers[0]]))
                print(f"  {name:10} {workers} worker(s): {', '.join(f'{s:.1f}' for s in speeds)} MB/s, "
                      f"{cores:.2f} cores busy (load {load()})", flush=True)
        print(f"\n| tokenizer | workers | MB/s (median of {args.runs}) | cores busy | speed-up |")
        print("|---|---|---|---|---|")
        for name, workers, median, cores, speedup in rows:
            print(f"| {name} | {workers} | {median:.1f} | {cores:.2f} | {speedup:.2f}x |")
        print(f"\nload after: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
