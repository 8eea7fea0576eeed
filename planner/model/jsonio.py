"""Reading the planner's JSON inputs (chains, schedules) from a dict, a JSON string or a file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def load_json(source: str | Path | Mapping[str, Any], error: type[Exception], what: str, expected: str) -> Any:
    """Returns the parsed JSON of ``source``.

    Args:
        source: a dict (returned as is), a JSON string (starting with ``{``) or a file path.
        error: the exception type to raise on a missing file or invalid JSON.
        what: the kind of file, for messages (``"chain"``).
        expected: what the file should hold, for the missing-file message.
    """
    if isinstance(source, Mapping):
        return source
    text = str(source)
    if isinstance(source, Path) or not text.lstrip().startswith("{"):
        path = Path(text)
        if not path.is_file():
            raise error(f"no {what} file at {path}: expected {expected}")
        text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise error(f"{what} is not valid JSON: {exc}") from None
