"""What a killed `llmtrain data prepare` left beside its output: removed by the next prepare to that output when
the process named in it is gone from this host, kept when it runs (two prepares at once) or ran on another host,
named and kept when it records no process; other outputs' temps untouched."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.corpus_files import write_corpus

from llmtrain.data.corpus import prepare_corpus
from llmtrain.data.prepare_leftovers import _host, clean_leftovers, temp_prefix


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_leftovers_of_a_process_gone_from_this_host_are_removed(tmp_path):
    host, dead = _host(), dead_pid()
    out = tmp_path / "o.bin"
    (tmp_path / f".o.bin.prepare-{dead}-{host}.abcd1234.tmp").write_bytes(b"x" * 1_500_000)
    (tmp_path / f".o.bin.json.prepare-{dead}-{host}.efgh5678.tmp").write_bytes(b"{}")
    parts = tmp_path / f".o.bin.prepare-{dead}-{host}.parts-ijkl9012"
    parts.mkdir()
    (parts / "unit-00000000.bin").write_bytes(b"y" * 500_000)
    kept = [f".o.bin.prepare-{os.getppid()}-{host}.mnop3456.tmp",  # a prepare running now
            f".o.bin.prepare-{dead}-{host}x.qrst7890.tmp",  # another host's
            f".other.bin.prepare-{dead}-{host}.uvwx1234.tmp",  # another output's
            "o.bin.keep"]
    for name in kept:
        (tmp_path / name).write_bytes(b"z")
    unowned = [".o.bin.1x2y3z4w.tmp", ".o.bin.parts-a1b2c3d4"]  # written before owners were recorded
    (tmp_path / unowned[0]).write_bytes(b"u" * 100_000)
    (tmp_path / unowned[1]).mkdir()

    notes = clean_leftovers(str(out))
    removed = [f".o.bin.json.prepare-{dead}-{host}.efgh5678.tmp", f".o.bin.prepare-{dead}-{host}.abcd1234.tmp",
               f".o.bin.prepare-{dead}-{host}.parts-ijkl9012"]
    assert notes == [
        f"removed leftovers of an interrupted prepare: {', '.join(str(tmp_path / n) for n in removed)} (2.0 MB)",
        f"left in place, from a prepare that did not record its process (remove them when no prepare of {out} is "
        f"running): {tmp_path / unowned[0]}, {tmp_path / unowned[1]} (0.1 MB)"]
    assert sorted(os.listdir(tmp_path)) == sorted(kept + unowned)
    assert clean_leftovers(str(out)) == notes[1:]


def test_a_prepare_names_its_temps_after_itself_and_leaves_none(tmp_path, monkeypatch):
    from llmtrain.data import prepare_output

    seen = []
    real = prepare_output.ShardWriter.append

    def append(self, part, nbytes):  # what lies beside the output while it is written
        seen.extend(sorted(p for p in os.listdir(tmp_path) if p.startswith(".")))
        return real(self, part, nbytes)

    monkeypatch.setattr(prepare_output.ShardWriter, "append", append)
    corpus = write_corpus(tmp_path / "in", files=2, words=100)
    prepare_corpus([str(corpus)], str(tmp_path / "o"), shard_tokens=100)
    prefix = temp_prefix(str(tmp_path / "o"))
    assert prefix == f".o.prepare-{os.getpid()}-{_host()}."
    assert len(seen) == 4 and all(name.startswith(prefix) for name in seen), seen  # parts and the shard folder
    assert sorted(os.listdir(tmp_path)) == ["in", "o"]
