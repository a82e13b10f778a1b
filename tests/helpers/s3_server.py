"""An S3-compatible server on loopback for the object-store tests: moto's standalone server (moto.server's
ThreadedMotoServer, from the package index, pure Python), reached through the real client stack (fsspec, s3fs,
aiobotocore) over HTTP, exactly as a worker reaches S3. Its buckets live in the test process's memory."""

from __future__ import annotations

import os
import socket
import uuid
from contextlib import closing
from dataclasses import dataclass, field

# What a client needs to find the server; the keys are moto's any-value credentials, not secrets.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


# Faults must outlast the client's retries in seconds, not minutes: botocore's own (up to 5 attempts with backoff of
# up to 8 s each) are cut to one attempt, which leaves s3fs's own 5 tries (about 2 s of backoff in all).
QUICK_RETRIES = {"AWS_MAX_ATTEMPTS": "1"}


def fresh_clients() -> None:
    """Forget this process's object-store client: it read AWS_ENDPOINT_URL once, when first used."""
    from llmtrain.checkpoint import storage

    storage._object_storage.cache_clear()


def free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    endpoint: str
    server: object = field(repr=False)

    @property
    def env(self) -> dict[str, str]:
        """The variables a process needs to use this server as its S3."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def environ(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def filesystem(self):
        import s3fs

        return s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=self.endpoint,
                                 use_listings_cache=False, skip_instance_cache=True)

    def bucket(self, prefix: str = "ckpt") -> str:
        """A new, empty bucket; its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.filesystem().mkdir(name)
        return name

    def stop(self) -> None:
        self.server.stop()


def start(address: str = "127.0.0.1") -> S3Server:
    """A server on `address` (loopback; the test cluster's bridge address for its nodes to reach it)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address=address, port=port, verbose=False)
    server.start()
    return S3Server(f"http://{address}:{port}", server)
