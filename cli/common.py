"""What the commands share: option checks, the chain of a run or a file, atomic output, optional extras.

Every check raises a :class:`~memprof.errors.MemprofError` (or, as an argparse ``type``, a usage error), which
:func:`cli.main.main` prints as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from memprof.atomic import write_atomically
from memprof.errors import MemprofError
from memprof.units import SizeParseError, parse_bytes

if TYPE_CHECKING:
    from planner import Chain

DASHBOARD_EXTRA = "the dashboard needs the dashboard extra: pip install 'memprof[dashboard]'"
#: Every option that takes a byte size, with what its value is called and an example, for :func:`size_option`.
SIZE_OPTIONS = {
    "--budget": ("a budget", "5MiB"),
    "--activation-budget": ("a budget", "5MiB"),
    "--held-budget": ("a budget", "5MiB"),
    "--host-cap": ("a host cap", "64GiB"),
    "--memory": ("the memory to fit", "16GiB"),
}


class OptionError(MemprofError):
    """A command-line option has a value the command cannot use; the message names the option."""


class MissingExtraError(MemprofError):
    """An optional dependency the command needs is not installed; the message says which extra to install."""


def positive_int(text: str | int, option: str) -> int:
    """``text`` as a whole number >= 1.

    Raises:
        OptionError: it is not one (the message names ``option``).
    """
    try:
        value = int(str(text), 10)
    except ValueError:
        raise OptionError(f"{option} must be a whole number >= 1, found {text!r}") from None
    if value < 1:
        raise OptionError(f"{option} must be a whole number >= 1, found {text!r}")
    return value


def size_option(text: str, option: str) -> int:
    """The value of the size option ``option`` (one of :data:`SIZE_OPTIONS`) in bytes.

    A negative size gets its own message (``a budget is a positive size such as 5MiB; found -5MiB``);
    ``cli.main`` passes ``--budget -5MiB`` to the parser as ``--budget=-5MiB`` so that it gets here.

    Raises:
        SizeParseError: ``text`` is not a positive byte size.
    """
    what, example = SIZE_OPTIONS[option]
    body = str(text).strip()
    if body.startswith("-"):
        try:
            parse_bytes(body[1:])
        except SizeParseError:
            pass  # not a size at all: parse_bytes says what a size looks like
        else:
            raise SizeParseError(f"{option}: {what} is a positive size such as {example}; found {body}")
    return parse_bytes(body)


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number in ``low..high`` (no upper end when ``high`` is None).

    A value outside is a usage error: one line, ``memprof CMD: error: argument --OPT: must be ...``.
    """
    wanted = f"a whole number between {low} and {high}" if high is not None else f"a whole number >= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, found {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {wanted}, found {text!r}")
        return value

    return parse


#: An argparse ``type`` for TCP ports.
port_number = whole_number(1, 65535)


def load_chain(source: str | Path, container: str | None = None, checkpoints: list[str] | None = None,
               recompute_cost: str = "time", selective_overhead_us: float | None = None,
               loss_options: bool = True, rank: int | None = None) -> Chain:
    """The chain of a run directory (found, the children of ``container``, or the named ``checkpoints``) or of
    a chain JSON file; with ``loss_options=False``, its loss stage offers no chunked option (a run's chain is
    then also found without them: ``chain_from_trace(..., loss_chunks=())``). A torchrun job's folder gives
    ``rank``'s chain (``None``: the rank whose peak is highest).

    Raises:
        ChainError: no such path, or the file is not a chain.
        NotAChainError, TraceError: the run directory has no usable chain or is not a readable run.
        OptionError: ``container`` was given with a chain file.
    """
    from planner import Chain, ChainError

    path = Path(source)
    if path.is_dir():
        from cli.runs import open_run
        from planner import chain_from_trace

        if checkpoints is not None and container is not None:
            raise OptionError("--checkpoints names the stages themselves; drop --container")
        chunks = {} if loss_options else {"loss_chunks": ()}  # else chain_from_trace's default chunk counts
        return chain_from_trace(open_run(path, rank), container=container, checkpoints=checkpoints,
                                recompute_cost=recompute_cost, selective_overhead_us=selective_overhead_us, **chunks)
    if not path.exists():
        raise ChainError(f"no run directory or chain file at {path}")
    if checkpoints is not None:
        raise OptionError(f"--checkpoints chooses the stages in a run directory, but {path} is a chain file; "
                          "drop --checkpoints")
    if container is not None:
        raise OptionError(
            f"--container chooses the chain in a run directory, but {path} is a chain file (its stages already "
            "name their modules); drop --container"
        )
    chain = Chain.from_json(path)
    if loss_options:
        return chain
    from planner.discovery.loss_options import without_loss_options

    return without_loss_options(chain)


def write_output(path: str | Path, text: str) -> Path:
    """Writes a command's ``--out`` atomically: a failed command never leaves a partial or changed file.

    Raises:
        OptionError: the directory does not exist, ``path`` is a directory, or the file cannot be written.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise OptionError(f"cannot write {path}: directory {directory} does not exist")
    if path.is_dir():
        raise OptionError(f"cannot write {path}: it is a directory; expected a file name")
    try:
        return write_atomically(path, text)
    except OSError as exc:
        raise OptionError(f"cannot write {path}: {exc.strerror or exc}") from None


def require_dashboard_extra() -> None:
    """Checks that the dashboard's dependencies (dash, plotly) can be imported.

    Raises:
        MissingExtraError: they cannot; the message says how to install them.
    """
    try:
        import dash  # noqa: F401
        import plotly  # noqa: F401
    except ImportError:
        raise MissingExtraError(DASHBOARD_EXTRA) from None
