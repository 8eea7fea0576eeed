"""Byte sizes are printed honestly and parsed strictly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memprof.units import SizeParseError, binary_unit, format_bytes, parse_bytes


@pytest.mark.parametrize("value,text", [(0, "0 B"), (60, "60 B"), (1023, "1023 B"), (1024, "1.0 KiB"),
                                        (1536, "1.5 KiB"), (3 * 1024**2, "3.0 MiB"), (5 * 1024**3, "5.0 GiB")])
def test_format_bytes(value, text):
    assert format_bytes(value) == text


@given(st.integers(min_value=1, max_value=2**50))
def test_non_zero_sizes_never_print_as_zero(value):
    assert not format_bytes(value).startswith("0 ") and not format_bytes(value).startswith("0.0")


@pytest.mark.parametrize("text,value", [("64MiB", 64 * 1024**2), ("64 MiB", 64 * 1024**2), ("2GB", 2 * 10**9),
                                        ("1.5KiB", 1536), ("4096", 4096), (2e9, 2 * 10**9), ("1e3", 1000)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["64XB", "-1", "0", "1e30", "", "MiB", "nan", "inf", True])
def test_parse_bytes_rejects(text):
    with pytest.raises(SizeParseError):
        parse_bytes(text)


def test_a_size_error_is_a_memprof_error_and_a_value_error():
    from memprof.errors import MemprofError

    with pytest.raises(MemprofError):
        parse_bytes("64XB")
    with pytest.raises(ValueError):
        parse_bytes("64XB")


@pytest.mark.parametrize("value,unit", [(0, ("B", 1)), (0.5, ("B", 1)), (1023, ("B", 1)), (1024, ("KiB", 1024)),
                                        (-3 * 1024**2, ("MiB", 1024**2)), (1024**3, ("GiB", 1024**3)),
                                        (2**70, ("PiB", 1024**5))])
def test_binary_unit(value, unit):
    assert binary_unit(value) == unit
