"""Builds and loads memprof's native allocator reporter (``memprof/capture/native/reporter.cpp``).

The reporter is a small C++ ``ProfilerStateBase`` that sits in PyTorch's profiler slot of the thread
that starts it and appends every allocation and free the CPU and CUDA allocators report there to a
buffer, which :class:`memprof.capture.native.stream.NativeAllocationStream` drains at each
``record_stats()``. It is compiled on first use against the installed torch's own headers (about
10 s with g++; cached per torch version and source hash under :func:`cache_dir`, so later runs load it at
once) and called through ``ctypes`` with a C ABI, so installing memprof needs no compiler and no torch
at build time. Where it cannot be built (no C++ compiler, no torch headers) or ``MEMPROF_NATIVE=0``,
:func:`memprof.capture.streams.open_stream` falls back to torch.profiler, which gives the same events
at a higher cost per step.

``python -c "from memprof.capture.native.build import main; main()"`` builds it ahead of time (``make
setup`` does).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import torch

from memprof.atomic import atomic_path

SOURCE = Path(__file__).parent / "reporter.cpp"
ABI_VERSION = 6
#: Set to ``0`` to never use the native reporter (memprof then reads torch.profiler's events).
ENV_SWITCH = "MEMPROF_NATIVE"
_BUILD_TIMEOUT_S = 300
# NDEBUG as in torch's own build: its headers' debug-only checks read fields a release libtorch never sets.
_FLAGS = ("-O2", "-DNDEBUG", "-std=c++20", "-shared", "-fPIC", "-w")


class NativeBuildError(RuntimeError):
    """The native reporter could not be built or loaded; the message says why."""


def cache_dir() -> Path:
    """Where built reporters are kept: ``$MEMPROF_CACHE_DIR``, else ``$XDG_CACHE_HOME/memprof``, else ``~/.cache``."""
    root = os.environ.get("MEMPROF_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "memprof")
    return Path(root) / "native"


def _torch_dir() -> Path:
    return Path(torch.__file__).parent


def _compiler() -> str:
    found = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not found:
        raise NativeBuildError("no C++ compiler found (set CXX, or install g++)")
    return found


#: Leaves out the one part of the reporter that names private members of c10's CPU allocator (to keep c10's "Memory
#: block of unknown size" line quiet): the build's second try, where a torch no longer has them.
_WITHOUT_QUIET_FREES = "-DMEMPROF_NO_QUIET_FREES"


def _command(compiler: str, output: Path, *extra: str) -> list[str]:
    include = _torch_dir() / "include"
    lib = _torch_dir() / "lib"
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return [compiler, *_FLAGS, *extra, f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}", str(SOURCE),
            f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}", "-o", str(output)]


def library_path() -> Path:
    """The cached library's path for this torch and this source (it may not be built yet)."""
    key = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode() + str(_torch_dir()).encode()
                         + sys.platform.encode() + " ".join(_FLAGS).encode()).hexdigest()[:16]
    return cache_dir() / f"{torch.__version__.replace('+', '_')}-{key}" / "libmemprof_reporter.so"


def build(force: bool = False) -> Path:
    """Compiles the reporter into the cache unless it is there already; returns its path.

    Raises:
        NativeBuildError: not Linux/macOS, no compiler, no torch headers, or the compiler failed.
    """
    target = library_path()
    if target.exists() and not force:
        return target
    if os.name != "posix":
        raise NativeBuildError(f"the native reporter is built on Linux and macOS only, found {sys.platform}")
    if not (_torch_dir() / "include" / "torch" / "csrc" / "profiler").is_dir():
        raise NativeBuildError(f"torch's C++ headers are missing from {_torch_dir() / 'include'}")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent builds (one per rank) never load a half-written file.
    with atomic_path(target) as partial:
        compiler = _compiler()
        done = _compile(_command(compiler, partial))
        if done.returncode != 0:
            done = _compile(_command(compiler, partial, _WITHOUT_QUIET_FREES))
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise NativeBuildError(f"the compiler failed (exit {done.returncode}): {' | '.join(tail)}")
    return target


def _compile(command: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeBuildError(f"the compiler could not run: {exc}") from exc


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    handle, i64 = ctypes.c_void_p, ctypes.c_int64
    signatures = {
        "memprof_abi_version": ([], ctypes.c_int),
        "memprof_create": ([], handle),
        "memprof_destroy": ([handle], None),
        "memprof_push": ([handle], ctypes.c_int),
        "memprof_pop": ([handle], ctypes.c_int),
        "memprof_active": ([handle], ctypes.c_int),
        "memprof_drain": ([handle, ctypes.c_void_p, i64, i64, ctypes.c_void_p], i64),
        "memprof_net_bytes": ([handle, ctypes.c_int], i64),
        "memprof_last_oom": ([handle, ctypes.c_void_p], i64),
        "memprof_watch_threads": ([handle], ctypes.c_int),
        "memprof_unwatch_threads": ([handle], ctypes.c_int),
        "memprof_foreign_frees": ([handle], i64),
    }
    for name, (args, result) in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = args, result
    return lib


@cache
def load() -> ctypes.CDLL:
    """Builds (if needed) and loads the reporter library, once per process.

    Raises:
        NativeBuildError: it cannot be built or loaded, or it was switched off with ``MEMPROF_NATIVE=0``.
    """
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        raise NativeBuildError(f"switched off by {ENV_SWITCH}=0")
    path = build()
    try:
        lib = _declare(ctypes.CDLL(str(path)))
    except (OSError, AttributeError) as exc:
        raise NativeBuildError(f"{path} could not be loaded: {exc}") from exc
    if lib.memprof_abi_version() != ABI_VERSION:
        raise NativeBuildError(f"{path} has ABI {lib.memprof_abi_version()}, expected {ABI_VERSION}")
    return lib


def main() -> int:
    """``python -m memprof.capture.native.build``: builds the reporter now and says where it is."""
    try:
        path = build(force="--force" in sys.argv[1:])
    except NativeBuildError as exc:
        print(f"memprof: native reporter not built: {exc}; memprof will use torch.profiler's events",
              file=sys.stderr)
        return 1
    print(f"memprof: native allocator reporter ready at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
