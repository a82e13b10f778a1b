"""torch.distributed.checkpoint's fsspec writer and reader on one llmtrain filesystem, the writer counting what it
writes: an object store has no cheap way to read a shard back, so each rank's files' sizes and CRC32s are taken as
the bytes go out, for meta.json."""

from __future__ import annotations

import contextlib
import io
import os
import zlib

from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

METADATA_TMP = ".metadata.tmp"  # DCP writes its index under this name and renames it


class CrcStream(io.RawIOBase):
    """Passes writes through, counting bytes and their CRC32."""

    def __init__(self, inner):
        self.inner = inner
        self.bytes = 0
        self.crc = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.bytes += len(view)
        self.inner.write(view)
        return len(view)

    def tell(self) -> int:
        return self.bytes

    def flush(self) -> None:
        self.inner.flush()

    def fileno(self) -> int:  # DCP fsyncs a local file through it
        return self.inner.fileno()

    def close(self) -> None:  # the inner stream is closed by whoever opened it
        super().close()


def count_writes(writer):
    """`writer.written`: {file name: {"bytes", "crc32"}} of the files this rank wrote through `writer` (DCP's index
    under its final name). Returns `writer`."""
    writer.written = {}
    opened = writer.fs.create_stream

    @contextlib.contextmanager
    def counted(path, mode):
        with opened(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            wrapper = CrcStream(stream)
            yield wrapper
            name = os.path.basename(os.fspath(path))
            writer.written[".metadata" if name == METADATA_TMP else name] = {"bytes": wrapper.bytes,
                                                                             "crc32": wrapper.crc}

    writer.fs.create_stream = counted
    return writer


class CountingFsspecWriter(FsspecWriter):
    """torch's fsspec writer on `fs`, counting what it writes (count_writes)."""

    def __init__(self, path: str, fs):
        # fsync is meaningless on an object store, and DCP's fallback to os.sync() would flush local disks.
        super().__init__(path, sync_files=False)
        self.fs.fs = fs
        count_writes(self)


def counting_local_writer(path: str):
    """torch's filesystem writer, counting what this rank writes: a fast tier on each node's own disk cannot read
    the other nodes' shards back for the manifest."""
    from torch.distributed.checkpoint import FileSystemWriter

    return count_writes(FileSystemWriter(path))


class StoreReader(FsspecReader):
    """torch's fsspec reader on `fs`, its files opened with `options` for reading (a smaller read-ahead)."""

    def __init__(self, path: str, fs, options: dict | None = None):
        super().__init__(path)
        self.fs.fs = fs
        if options:
            @contextlib.contextmanager
            def opened(path, mode):
                with fs.open(os.fspath(path), mode, **(options if "r" in mode else {})) as stream:
                    yield stream

            self.fs.create_stream = opened
