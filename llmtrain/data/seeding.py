"""Stable hashing of (seed, name, index...) tuples.

Python's hash() is salted per process, so ranks and restarts would disagree; blake2b is not.
"""

import hashlib


def stable_digest(*parts: object, size: int = 8) -> bytes:
    """`size` bytes that depend only on the parts' str() values, identical in every process."""
    text = "\x1f".join(str(part) for part in parts)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=size).digest()


def stable_seed(*parts: object) -> int:
    """A non-negative 63-bit integer for torch.Generator.manual_seed."""
    return int.from_bytes(stable_digest(*parts, size=8), "little") & (2**63 - 1)
