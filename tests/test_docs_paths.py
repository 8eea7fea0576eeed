"""The architecture page names files that exist: a move that forgets the docs fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: A path in backticks with a folder and a source suffix, e.g. `planner/model/chain.py`.
_PATH = re.compile(r"`([\w./-]+/[\w.-]+\.(?:py|md|cpp|json))`")


def test_every_file_the_architecture_page_names_exists() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(_PATH.findall(text))
    assert len(named) > 40  # the page names the modules that own each rule
    missing = sorted(p for p in named if not (ROOT / p).exists() and not (ROOT / "docs" / p).exists())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"
