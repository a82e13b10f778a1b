"""model.init_from's check of the stored tensors against the model the config builds, from their headers alone:
which Pieces fill each parameter, every parameter filled with its shape, every stacked parameter with all its rows,
nothing left over. The first difference is one ConfigError line naming the tensor, the file and the config key.
"""

from __future__ import annotations

from llmtrain.checkpoint.weight_map import EMBED, HEAD, POS, Piece, clean_name, shape_key
from llmtrain.config import ConfigError
from llmtrain.config.derived import padded_vocab_size

KEY = "model.init_from"


def pieces_of(spec, key: str) -> list[Piece] | None:
    """Where stored tensor `key` goes: llmtrain names (spec None) as they are, else the family adapter's Pieces."""
    return [Piece(clean_name(key), key)] if spec is None else spec.hf_adapter().pieces(key)


def match_pieces(src, model_cfg, spec, not_loaded: set[str] = frozenset()) -> dict[str, list[Piece]]:
    """{llmtrain name: its one Piece, or a stacked parameter's rows in slot order} for source `src` (a
    pretrained.Pretrained with its stored headers and the expected shapes) of a model of family `spec`. Stored
    names in `not_loaded` (the model's persistent buffers, in an llmtrain export: a routing bias starts at zero as
    in any new run) are passed over."""
    whole, rows = _collect(src)
    expected = src.expected_shapes
    if HEAD not in expected:
        whole.pop(HEAD, None)  # a tied head is the embedding: a stored copy is not used
    out: dict[str, list[Piece]] = {}
    for name, shape in expected.items():
        if name in rows:
            out[name] = _check_stack(src, name, rows[name], shape, spec)
            continue
        if name not in whole:
            hint = " (the file's model ties its head: set model.tie_embeddings=true)" if name == HEAD else ""
            raise ConfigError(KEY, f"missing tensor {name} in {src.path}{hint}")
        _check_whole(src, name, whole[name], shape, model_cfg, spec)
        out[name] = [whole[name]]
    unexpected = [p for n, p in whole.items() if n not in expected and n not in not_loaded] + \
                 [p for n, by_slot in rows.items() if n not in expected for p in by_slot.values()]
    if unexpected:
        key = unexpected[0].key
        raise ConfigError(KEY, f"unexpected tensor {key} in {src.stored[key].file} (does model.n_layers match?)")
    return out


def _collect(src) -> tuple[dict[str, Piece], dict[str, dict[int, Piece]]]:
    """The Pieces of every stored tensor: whole parameters by name, stacked ones by name and slot."""
    whole: dict[str, Piece] = {}
    rows: dict[str, dict[int, Piece]] = {}
    for key in src.stored:
        found = pieces_of(src.spec, key)
        if found is None:
            raise ConfigError(KEY, f"unexpected tensor {key} in {src.stored[key].file} (not a {src.format_name} "
                                   f"name)")
        for piece in found:
            if piece.stacked:
                rows.setdefault(piece.name, {}).setdefault(piece.slot, piece)
            else:
                whole.setdefault(piece.name, piece)
    return whole, rows


def _check_whole(src, name: str, piece: Piece, shape: tuple[int, ...], model_cfg, spec) -> None:
    stored = src.stored[piece.key]
    got = piece.shape(stored.shape)
    vocab, padded = model_cfg.vocab_size, padded_vocab_size(model_cfg)
    if name in (EMBED, HEAD) and got[1:] == shape[1:] and got[0] in (vocab, padded):
        pass  # the real vocabulary (Hugging Face) or the padded one
    elif name == POS and got[1:] == shape[1:] and got[0] > shape[0]:
        pass  # a longer position table: its first seq_len rows are used
    elif got != shape:
        want = (vocab, *shape[1:]) if name in (EMBED, HEAD) else shape
        raise ConfigError(KEY, f"{name} is {list(got)} in {stored.file} but the config builds {list(want)} "
                               f"({shape_key(name, _first_difference(got, want), spec)})")
    _check_floating(src, name, piece)


def _check_stack(src, name: str, by_slot: dict[int, Piece], shape: tuple[int, ...], spec) -> list[Piece]:
    """A stacked parameter's rows: as many as the model has (its first dimension), each of the row's shape."""
    last = by_slot[max(by_slot)]
    count = max(max(by_slot) + 1, last.slots)
    if count != shape[0]:
        got = (count, *last.shape(src.stored[last.key].shape))
        raise ConfigError(KEY, f"{name} is {list(got)} (stacked from {len(by_slot)} tensors) in "
                               f"{src.stored[last.key].file} but the config builds {list(shape)} "
                               f"({shape_key(name, 0, spec)})")
    missing = [j for j in range(count) if j not in by_slot]
    if missing:
        raise ConfigError(KEY, f"missing expert {missing[0]} of {name} in {src.path} (found the tensors of "
                               f"{len(by_slot)} of its {count} experts)")
    for j in range(count):
        piece = by_slot[j]
        stored = src.stored[piece.key]
        got = piece.shape(stored.shape)
        if got != shape[1:]:
            dim = _first_difference(got, shape[1:]) + 1
            raise ConfigError(KEY, f"{piece.key} (expert {j} of {name}) is {list(got)} in {stored.file} but the config "
                                   f"builds {list(shape[1:])} per expert ({shape_key(name, dim, spec)})")
        _check_floating(src, name, piece)
    return [by_slot[j] for j in range(count)]


def _check_floating(src, name: str, piece: Piece) -> None:
    stored = src.stored[piece.key]
    if not stored.floating:
        raise ConfigError(KEY, f"{name} in {stored.file} is not a floating-point tensor")


def _first_difference(got: tuple[int, ...], want: tuple[int, ...]) -> int:
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), 0)
