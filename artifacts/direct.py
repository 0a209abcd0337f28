"""Large files written around the page cache (O_DIRECT) and hashed on the way.

A checkpoint's optimizer state (AdamW's two float32 moments per weight: 1.1 GB for a 135M-parameter model) is
written once, flushed to the disk before its key is recorded, and read back only if a run resumes from it. Written
through the page cache, each 4 KB of it first takes a fresh page from the kernel — on the virtual machines measured,
the slowest part of the write — and is flushed after. `DirectFile` writes it with O_DIRECT
instead: the bytes go from one aligned buffer, reused block after block, straight to the disk, and the writer's
digest (`file_digest`'s, XXH3-128 of the same bytes, computed as they pass) spares reading the file back to hash it.

The last block is padded to the disk's alignment for the write and the file truncated to its length. Where the
filesystem has no O_DIRECT (tmpfs, some network mounts: the open fails with EINVAL) the file is written buffered;
the bytes and the digest are the same. Flushing stays the store's (`sync_files`): after a direct write it only
has the file's metadata and the device's cache to flush.
"""

import errno
import io
import mmap
import os
from pathlib import Path

import xxhash

from coopflow.artifacts.store import XXH3

__all__ = ["DirectFile"]

BLOCK = 8 << 20
"""Bytes per direct write (a multiple of every disk's alignment)."""

ALIGN = 4096
"""What O_DIRECT writes' lengths and offsets are padded to (a page: at least any disk's logical block)."""


class DirectFile(io.RawIOBase):
    """A new binary file at `path` for `write` only (e.g. `torch.save(obj, DirectFile(p))`), written with O_DIRECT
    where the filesystem allows it; `digest` (after `close`) is its `file_digest`."""

    def __init__(self, path: Path | str):
        super().__init__()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        self.direct = hasattr(os, "O_DIRECT")
        try:
            self._fd = os.open(path, flags | (os.O_DIRECT if self.direct else 0), 0o644)
        except OSError as err:
            if err.errno != errno.EINVAL or not self.direct:
                raise
            self.direct = False  # no O_DIRECT on this filesystem
            self._fd = os.open(path, flags, 0o644)
        self._buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
        self._view = memoryview(self._buf)
        self._fill = 0
        self._size = 0
        self._hash = xxhash.xxh3_128()
        self._digest: str | None = None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        src = memoryview(data).cast("B")
        n = len(src)
        self._hash.update(src)
        done = 0
        while done < n:
            take = min(BLOCK - self._fill, n - done)
            self._view[self._fill:self._fill + take] = src[done:done + take]
            self._fill += take
            done += take
            if self._fill == BLOCK:
                self._write_out(BLOCK)
        self._size += n
        return n

    def _write_out(self, length: int) -> None:
        """Write the buffer's first `length` bytes (a multiple of ALIGN) at the file's end; the buffer is then empty."""
        out = 0
        while out < length:
            out += os.write(self._fd, self._view[out:length])
        self._fill = 0

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._fill:
                tail = self._fill
                padded = -(-tail // ALIGN) * ALIGN if self.direct else tail
                self._view[tail:padded] = bytes(padded - tail)
                self._write_out(padded)
                if padded != tail:
                    os.ftruncate(self._fd, self._size)
            self._digest = XXH3 + self._hash.hexdigest()
        finally:
            os.close(self._fd)
            self._view.release()
            self._buf.close()
            super().close()

    @property
    def digest(self) -> str:
        """The file's `file_digest` (once closed)."""
        if self._digest is None:
            raise ValueError("DirectFile.digest: the file is not closed (or its write failed)")
        return self._digest

