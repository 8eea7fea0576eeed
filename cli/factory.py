"""Loading a user's ``MODULE:FACTORY``: the model, batch and loss a command estimates, built by their own code.

The contract: ``FACTORY(batch_size)`` returns ``(model, batch, loss_fn)`` where ``loss_fn(model, batch)`` returns
the scalar loss. ``MODULE`` is a dotted module name importable from the current directory
(``mypkg.models:build``) or the path of a Python file (``models/gpt.py:build``). Build the model under
``torch.device("meta")`` to allocate none of its weights.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memprof.errors import MemprofError

__all__ = ["FactoryError", "build", "load_factory"]

FORMAT = "MODULE:FACTORY (a module name or a .py file, a colon, a function name; e.g. models.py:build)"


class FactoryError(MemprofError):
    """A ``MODULE:FACTORY`` cannot be loaded, or the factory failed or returned something else."""


def _module(name: str) -> Any:
    if name.endswith(".py") or "/" in name or "\\" in name:
        path = Path(name)
        if not path.is_file():
            raise FactoryError(f"no Python file at {path} (from {name!r}); expected {FORMAT}")
        spec = importlib.util.spec_from_file_location(f"memprof_factory_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise FactoryError(f"cannot load {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses and pickling look modules up by name
        spec.loader.exec_module(module)
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, "")  # the console script does not put the current directory on the path
    return importlib.import_module(name)


def load_factory(spec: str) -> Callable[[int], Any]:
    """The function ``spec`` (``MODULE:FACTORY``) names.

    Raises:
        FactoryError: the spec is malformed, the module cannot be imported (or raised while importing), or it
            has no such callable.
    """
    module_name, colon, attribute = spec.rpartition(":")
    if not colon or not module_name or not attribute.isidentifier():
        raise FactoryError(f"expected {FORMAT}, found {spec!r}")
    try:
        module = _module(module_name)
    except FactoryError:
        raise
    except ImportError as exc:
        raise FactoryError(f"cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the user's module raised while it ran: report it, not a traceback
        raise FactoryError(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        found = "nothing" if factory is None else type(factory).__name__
        raise FactoryError(f"{module_name!r} has no function {attribute!r} (found {found}); expected {FORMAT}")
    return factory


def build(factory: Callable[[int], Any], spec: str, batch_size: int) -> tuple[Any, Any, Callable[..., Any]]:
    """Calls ``factory(batch_size)`` and checks it returned ``(model, batch, loss_fn)``.

    Raises:
        FactoryError: the factory raised, or returned something else.
    """
    try:
        built = factory(batch_size)
    except Exception as exc:
        raise FactoryError(f"{spec}({batch_size}) raised {type(exc).__name__}: {exc}") from None
    if not isinstance(built, tuple) or len(built) != 3 or not callable(built[2]):
        raise FactoryError(f"{spec}({batch_size}) must return (model, batch, loss_fn), found "
                           f"{type(built).__name__}{f' of {len(built)}' if isinstance(built, tuple) else ''}")
    return built
