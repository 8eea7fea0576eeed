"""memprof's public names: each package's ``__all__`` is sorted and resolves, and the top-level names are documented."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["memprof", "memprof.capture", "memprof.analysis", "memprof.trace", "memprof.interop",
            "memprof.estimation", "memprof.integrations"]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_resolves_and_the_list_is_sorted(name: str) -> None:
    package = importlib.import_module(name)
    assert list(package.__all__) == sorted(package.__all__)
    for exported in package.__all__:
        assert getattr(package, exported) is not None, f"{name}.{exported}"


@pytest.mark.parametrize("name", PACKAGES)
def test_unknown_names_raise_attribute_error(name: str) -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = importlib.import_module(name).no_such_name


def test_the_top_level_names_are_documented() -> None:
    import memprof

    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    missing = [name for name in memprof.__all__ if name not in docs]
    assert not missing, f"memprof exports names the README and docs never mention: {missing}"
