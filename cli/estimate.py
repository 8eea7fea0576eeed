"""``memprof estimate MODULE:FACTORY``: a training step's memory predicted on fake tensors, and the largest batch
that fits a memory, as is and with the planner's schedule.

``FACTORY(batch_size)`` returns ``(model, batch, loss_fn)`` (see :mod:`cli.factory`). The estimate is
:func:`memprof.estimate`; its trace is written under ``--out`` for ``memprof report``, ``plan`` and
``dashboard``. Whatever the user's code raises is reported as one line, as any bad input.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cli.common import OptionError, positive_int, size_option
from cli.factory import FactoryError, build, load_factory
from memprof.categories import CATEGORIES
from memprof.errors import EstimateError, MemprofError
from memprof.units import format_bytes

OPTIMIZERS = ("sgd", "adam", "adamw", "none")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``memprof estimate`` to the ``memprof`` command."""
    parser = subparsers.add_parser(
        "estimate", help="predict a training step's memory on fake tensors, before running it",
        description="Run two training steps of FACTORY(batch_size) -> (model, batch, loss_fn) on fake tensors "
                    "(no memory, no data) and report the second step's peak; write it as a trace. With "
                    "--max-batch, find the largest batch whose predicted peak fits --memory, as is and with "
                    "the planner's schedule.")
    parser.add_argument("factory", metavar="MODULE:FACTORY",
                        help="a module name or .py file, a colon, a function taking the batch size")
    parser.add_argument("--batch-size", default=None, help="the batch size (with --max-batch: where to start)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw",
                        help="sgd (momentum 0.9), adam, adamw (default) or none (forward and backward only)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="the device modelled (default: the model's; cpu for a meta model)")
    parser.add_argument("--out", default="traces", help="folder for the estimate's trace (default traces)")
    parser.add_argument("--run-id", default=None, help="name of the run (default: model class and time)")
    parser.add_argument("--max-batch", action="store_true", help="search the largest batch that fits --memory")
    parser.add_argument("--memory", default=None, help="with --max-batch: the memory to fit, e.g. 16GiB")
    parser.add_argument("--algorithm", default="rotor", help="with --max-batch: the planner's algorithm (rotor)")
    parser.set_defaults(func=run_estimate)


def optimizer_factory(name: str, device: str) -> Callable[[list[Any]], Any] | None:
    """The factory of ``--optimizer``; on CUDA foreach, as PyTorch chooses for CUDA parameters."""
    import torch

    foreach = True if device == "cuda" else None
    factories: dict[str, Callable[[list[Any]], Any]] = {
        "sgd": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, foreach=foreach),
        "adam": lambda p: torch.optim.Adam(p, lr=1e-3, foreach=foreach),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=foreach),
    }
    return factories.get(name)


class _Estimator:
    """Builds with the factory and estimates, one batch size at a time, remembering each result.

    A warning every estimate of the model would give (a key/value cache it builds and never reads) is said by
    the first only: ``--max-batch`` runs a dozen or more.
    """

    def __init__(self, args: argparse.Namespace, out_dir: Path, run_id: str | None) -> None:
        self.spec = args.factory
        self.factory = load_factory(args.factory)
        self.args, self.out_dir, self.run_id = args, out_dir, run_id
        self.found: dict[int, Any] = {}

    def __call__(self, batch_size: int) -> Any:
        from memprof import estimate
        from memprof.capture.kv_cache import KeyValueCacheWarning

        if batch_size not in self.found:
            model, batch, loss_fn = build(self.factory, self.spec, batch_size)
            device = self.args.device or _device_of(model)
            run_id = f"{self.run_id}-batch{batch_size}" if self.run_id and self.args.max_batch else self.run_id
            try:
                with warnings.catch_warnings():
                    if self.found:  # the first estimate named the cache; the others would, at other sizes
                        warnings.simplefilter("ignore", KeyValueCacheWarning)
                    self.found[batch_size] = estimate(model, batch, loss_fn,
                                                      optimizer_factory(self.args.optimizer, device),
                                                      device=device, out_dir=self.out_dir, run_id=run_id)
            except MemprofError:
                raise
            except Exception as exc:  # the user's model or loss raised: one line, as bad input
                raise EstimateError(f"the step of {self.spec}({batch_size}) raised {type(exc).__name__}: "
                                    f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None
        return self.found[batch_size]


def _device_of(model: Any) -> str:
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return "cuda" if first is not None and first.device.type == "cuda" else "cpu"


def run_estimate(args: argparse.Namespace) -> int:
    """Estimates one batch size, or searches the largest that fits with ``--max-batch``.

    Raises:
        FactoryError: MODULE:FACTORY cannot be loaded, or the factory failed.
        EstimateError: the step cannot run on fake tensors (the message names the operator), or it raised.
        OptionError, SizeParseError: a bad option.
    """
    if args.max_batch:
        return _run_max_batch(args)
    if args.memory is not None:
        raise OptionError("--memory is the memory --max-batch fits; add --max-batch (or drop --memory)")
    if args.batch_size is None:
        raise OptionError("--batch-size is required (or use --max-batch --memory SIZE to search it)")
    batch_size = positive_int(args.batch_size, "--batch-size")
    found = _Estimator(args, Path(args.out), args.run_id)(batch_size)
    print(summary(found, args.factory, batch_size, args.optimizer))
    return 0


def summary(found: Any, spec: str, batch_size: int, optimizer: str) -> str:
    """What one estimate says, in a few lines."""
    categories = ", ".join(f"{c.value} {format_bytes(found.categories_at_peak_bytes[c])}" for c in CATEGORIES
                           if found.categories_at_peak_bytes[c])
    where = f"{found.peak_phase}" + (f", in {found.peak_module!r}" if found.peak_module else "")
    lines = [f"estimate of {spec} at batch {batch_size}, optimizer {optimizer}, on {found.device} "
             f"(fake tensors, {found.seconds:.1f} s)",
             f"  step peak   {format_bytes(found.peak_bytes)} allocated ({where})",
             f"  at the peak {categories}"]
    if found.reserved_peak_bytes is not None:
        lines.append(f"  reserved    {format_bytes(found.reserved_peak_bytes)} (the caching allocator's segments)")
    lines.append(f"  trace       {found.run_dir} (memprof report / plan / dashboard read it)")
    return "\n".join(lines)


def _run_max_batch(args: argparse.Namespace) -> int:
    from planner import NotAChainError, largest_fitting, planned_fit, solver

    if args.memory is None:
        raise OptionError("--max-batch needs --memory, the memory to fit (e.g. --memory 16GiB)")
    memory = size_option(args.memory, "--memory")
    start = positive_int(args.batch_size, "--batch-size") if args.batch_size is not None else 1
    solver(args.algorithm)  # an unknown algorithm fails before any estimate
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_id = args.run_id or f"estimate-{stamp}"
    scratch = Path(tempfile.mkdtemp(prefix="memprof-max-batch-"))
    try:
        estimator = _Estimator(args, scratch, run_id)
        as_is = largest_fitting(lambda n: estimator(n).peak_bytes <= memory, start)
        planned: dict[int, Any] = {}
        no_chain: list[str] = []

        def fits_planned(n: int) -> bool:
            try:
                planned[n] = planned_fit(estimator(n), memory, args.algorithm)
            except NotAChainError as exc:
                no_chain.append(str(exc))
                return False
            return planned[n] is not None

        with_plan = largest_fitting(fits_planned, as_is or start)
        kept = {n: _keep(estimator(n).run_dir, Path(args.out)) for n in {as_is, with_plan} if n is not None}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(_max_batch_lines(memory, estimator, as_is, with_plan, planned, kept, args.algorithm, no_chain))
    return 0 if as_is is not None or with_plan is not None else 1


def _keep(run_dir: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    target = out / run_dir.name
    if target.exists():
        raise OptionError(f"{target} already holds a trace; choose another --run-id or --out")
    return Path(shutil.move(str(run_dir), str(target)))


def _max_batch_lines(memory: int, estimator: _Estimator, as_is: int | None, with_plan: int | None,
                     planned: dict[int, Any], kept: dict[int, Path], algorithm: str, no_chain: list[str]) -> str:
    device = next(iter(estimator.found.values())).device
    lines = [f"largest batch of {estimator.spec} in {format_bytes(memory)} on {device} "
             f"({len(estimator.found)} estimates, optimizer {estimator.args.optimizer})"]
    if as_is is not None:
        lines.append(f"  as is         batch {as_is}: peak {format_bytes(estimator(as_is).peak_bytes)} "
                     f"(trace {kept[as_is]})")
    if with_plan is not None and planned.get(with_plan) is not None:
        plan = planned[with_plan]
        lines.append(f"  with {algorithm:<8} batch {with_plan}: peak {format_bytes(plan.peak_bytes)}, "
                     f"{plan.slowdown:+.0%} step time (trace {kept[with_plan]})")
    elif no_chain:
        lines.append(f"  with {algorithm:<8} no chain for the planner: {no_chain[-1]}")
    if as_is is None and with_plan is None:
        needs = format_bytes(estimator(min(estimator.found)).peak_bytes)
        lines.append(f"batch {min(estimator.found)} does not fit in {format_bytes(memory)} (needs {needs} as is), "
                     f"not even with {algorithm}")
        return "\n".join(lines)
    verdict = f"batch {as_is} fits as is" if as_is is not None else "no batch fits as is"
    if with_plan is not None and as_is is not None and with_plan <= as_is:
        verdict += f"; {algorithm} fits no larger batch"
    elif with_plan is not None and planned.get(with_plan) is not None:
        verdict += f"; {with_plan} with {algorithm} at {planned[with_plan].slowdown:+.0%} step time"
    lines.append(verdict)
    return "\n".join(lines)


__all__ = ["FactoryError", "optimizer_factory", "register", "run_estimate", "summary"]
