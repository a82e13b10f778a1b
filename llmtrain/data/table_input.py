"""Columnar input of `llmtrain data prepare`: a `.parquet` file, or an Arrow IPC stream file (the `data-*.arrow` of a
Hugging Face `datasets` folder), one document per row, its --text-key column. Read with pyarrow in record batches
of at most ROWS_PER_BATCH rows, never the whole file at once."""

from __future__ import annotations

from typing import Iterator

from .bad_lines import BadLines
from .errors import DataError

ROWS_PER_BATCH = 1024
TEXT_KEY_FLAG = "--text-key"


def _pyarrow(name: str):
    try:
        import pyarrow  # optional dependency, only for parquet and datasets-folder input
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise DataError("--input", f"{name}: reading it needs the 'pyarrow' package: pip install pyarrow "
                                   "(or llmtrain[formats])") from None
    return pyarrow


def table_documents(path: str, name: str, kind: str, key: str, bad: BadLines) -> Iterator[str]:
    """The `key` column's strings, row by row; `kind` is "parquet" or "arrow". A null goes to `bad`."""
    pa = _pyarrow(name)
    try:
        if kind == "parquet":
            table = pa.parquet.ParquetFile(path)
            schema = table.schema_arrow
            _check_column(pa, schema, key, name)
            batches = table.iter_batches(batch_size=ROWS_PER_BATCH, columns=[key])
        else:
            batches = _arrow_batches(pa, path)
            schema = next(batches)
            _check_column(pa, schema, key, name)
        row = 0
        for batch in batches:
            for start in range(0, batch.num_rows, ROWS_PER_BATCH):
                for text in batch.slice(start, ROWS_PER_BATCH).column(key).to_pylist():
                    row += 1
                    if text is None:
                        bad.found(TEXT_KEY_FLAG, f"{name}:{row}", f"column {key!r} is null")
                    else:
                        yield text
    except (pa.ArrowException, OSError) as e:
        raise DataError("--input", f"cannot read {name} as {kind}: {e}") from None


def _arrow_batches(pa, path: str) -> Iterator:
    """The schema, then the record batches of an Arrow IPC stream (what `datasets` writes) or IPC file."""
    source = pa.memory_map(path)
    try:
        reader = pa.ipc.open_stream(source)
    except pa.ArrowInvalid:  # not a stream: the IPC file layout (ARROW1 magic, random access)
        reader = pa.ipc.open_file(source)
        yield reader.schema
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
        return
    yield reader.schema
    yield from reader


def _check_column(pa, schema, key: str, name: str) -> None:
    if key not in schema.names:
        raise DataError(TEXT_KEY_FLAG, f"{name} has no column {key!r}; its columns: "
                                       f"{', '.join(map(repr, schema.names)) or 'none'}")
    kind = schema.field(key).type
    text_types = (pa.types.is_string, pa.types.is_large_string, getattr(pa.types, "is_string_view", None))
    if not (pa.types.is_null(kind) or any(is_text(kind) for is_text in text_types if is_text)):
        raise DataError(TEXT_KEY_FLAG, f"{name}: column {key!r} holds {kind}, not strings")
