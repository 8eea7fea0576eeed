"""Atomic file writing: a file is either its old content or its complete new content, never half of one.

Every file this project writes (trace parts, ``meta.json``, journal state, the native reporter library,
schedules and exports from the command line) goes through :func:`atomic_path`: the content is written
under a hidden temporary name in the target's own directory and renamed over the target
(``os.replace`` is atomic on POSIX within one file system), so a reader never sees a partial file and
a process killed at any moment leaves the previous file intact.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yields a temporary path beside ``path``; on success it is renamed over ``path``.

    The caller creates the file at the yielded path (by any means: ``open``, a library writing to a
    path, a compiler's ``-o``). When the block ends without an exception the temporary file takes an
    existing target's permission bits and replaces it; when the block raises (or the rename fails) the
    temporary file is removed and the target is left as it was.

    Args:
        path: the file to write; its directory must exist.

    Yields:
        The temporary path, a hidden name in ``path``'s directory (not yet created).

    Raises:
        OSError: the rename or the permission copy failed (the temporary file is removed first).
    """
    path = Path(path)
    temporary = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        yield temporary
        _keep_mode(path, temporary)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _keep_mode(target: Path, temporary: Path) -> None:
    # A new file keeps the mode it was created with (the umask's, or a compiler's executable bits).
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        return
    os.chmod(temporary, mode)


def write_atomically(path: str | Path, data: str | bytes | memoryview, *, durable: bool = False) -> Path:
    """Writes ``data`` (text as UTF-8) to ``path`` through :func:`atomic_path`; returns ``path``.

    Args:
        path: the file to write; its directory must exist.
        data: the whole new content.
        durable: also ``fsync`` the content before the rename, which survives a power loss but costs
            milliseconds on a busy disk (worth it for files rewritten rarely, such as ``meta.json``).

    Raises:
        OSError: the file could not be written; ``path`` is unchanged and no temporary file remains.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path) as temporary, open(temporary, "wb") as handle:
        handle.write(payload)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    return Path(path)
