"""Byte sizes: honest formatting and strict parsing."""

from __future__ import annotations

import math
import re

from memprof.errors import MemprofError

_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_FACTORS = {
    "": 1,
    "B": 1,
    "K": 1024,
    "KB": 1000,
    "KIB": 1024,
    "M": 1024**2,
    "MB": 1000**2,
    "MIB": 1024**2,
    "G": 1024**3,
    "GB": 1000**3,
    "GIB": 1024**3,
    "T": 1024**4,
    "TB": 1000**4,
    "TIB": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


class SizeParseError(MemprofError, ValueError):
    """A byte size string could not be understood (a ``ValueError`` too, for callers that catch that)."""


def binary_unit(n: float) -> tuple[str, int]:
    """The largest binary unit not above ``abs(n)``: its name and its size in bytes.

    ``format_bytes`` writes a size in this unit, and figure axes that scale by it (ticks up to their
    largest value) say the same unit as the text beside them.

    Returns:
        ``("B", 1)`` below 1 KiB, then ``("KiB", 1024)``, ``("MiB", 1024**2)`` ... up to ``"PiB"``.
    """
    value, power = abs(float(n)), 0
    while value >= 1024 and power < len(_BINARY) - 1:
        value /= 1024
        power += 1
    return _BINARY[power], 1024**power


def format_bytes(n: float, precision: int = 1) -> str:
    """Formats a byte count with binary units, never rounding a non-zero size to zero.

    Args:
        n: the number of bytes (may be negative).
        precision: digits after the decimal point for units above bytes.

    Returns:
        A string such as ``"512 B"``, ``"1.5 KiB"`` or ``"3.2 GiB"``.
    """
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    sign = "-" if n < 0 else ""
    unit, factor = binary_unit(n)
    value = abs(float(n)) / factor  # exact: the factor is a power of two
    if factor == 1:
        return f"{sign}{int(round(value))} B"
    text = f"{value:.{precision}f}"
    if float(text) == 0:  # pragma: no cover - unreachable for unit > 0, kept as a guard
        text = f"{value:.3g}"
    return f"{sign}{text} {unit}"


def parse_bytes(text: str | int | float) -> int:
    """Parses a size such as ``"64MiB"``, ``"1.5 GB"``, ``"4096"`` or ``2e9`` into bytes.

    Binary units (KiB, MiB, GiB, TiB and the bare K, M, G, T) are powers of 1024; decimal
    units (KB, MB, GB, TB) are powers of 1000.

    Raises:
        SizeParseError: the text is not a positive, finite size with a known unit.
    """
    if isinstance(text, bool):
        raise SizeParseError(f"expected a byte size such as '64MiB', found {text!r}")
    if isinstance(text, (int, float)):
        value, factor = float(text), 1
    else:
        match = _SIZE_RE.match(str(text))
        if not match:
            raise SizeParseError(f"expected a byte size such as '64MiB' or '2GB', found {text!r}")
        unit = match.group(2).upper()
        if unit not in _FACTORS:
            raise SizeParseError(
                f"unknown unit {match.group(2)!r} in {text!r}; use B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB)"
            )
        value, factor = float(match.group(1)), _FACTORS[unit]
    total = value * factor
    if not math.isfinite(total) or total <= 0:
        raise SizeParseError(f"expected a positive, finite byte size, found {text!r}")
    if total >= 2**63:
        raise SizeParseError(f"byte size {text!r} is larger than any machine's memory (>= 2^63 bytes)")
    return int(math.ceil(total))
