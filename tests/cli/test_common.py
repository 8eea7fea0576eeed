"""The commands' shared checks: option values, atomic output, the dashboard extra."""

from __future__ import annotations

import argparse
import errno
import os
import sys

import pytest

from cli.common import (
    DASHBOARD_EXTRA,
    MissingExtraError,
    OptionError,
    port_number,
    positive_int,
    require_dashboard_extra,
    whole_number,
    write_output,
)
from memprof.errors import MemprofError


def test_positive_int():
    assert positive_int("12", "--slots") == 12 and positive_int(3, "--slots") == 3
    for bad in ("0", "-2", "many", "1.5", ""):
        with pytest.raises(OptionError, match=f"--slots must be a whole number >= 1, found '{bad}'"):
            positive_int(bad, "--slots")


def test_whole_number_and_port_types():
    assert whole_number(0)("0") == 0 and port_number("1") == 1 and port_number("65535") == 65535
    for bad in ("0", "65536", "-1", "http", "80.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be a whole number between 1 and 65535"):
            port_number(bad)
    with pytest.raises(argparse.ArgumentTypeError, match=">= 1, found '0'"):
        whole_number(1)("0")


def test_write_output_is_atomic_and_refuses_bad_paths(tmp_path):
    out = tmp_path / "s.json"
    out.write_text("old")
    out.chmod(0o640)
    assert write_output(out, "new") == out
    assert out.read_text() == "new" and (out.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]
    with pytest.raises(OptionError, match="directory .* does not exist"):
        write_output(tmp_path / "missing" / "s.json", "x")
    with pytest.raises(OptionError, match="it is a directory"):
        write_output(tmp_path, "x")


def test_write_output_turns_os_errors_into_one_option_error(tmp_path, monkeypatch):
    import cli.common

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cli.common, "write_atomically", full)
    out = tmp_path / "s.json"
    out.write_text("old")
    with pytest.raises(OptionError, match="cannot write .*No space left on device"):
        write_output(out, "new")
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


def test_missing_dashboard_extra(monkeypatch):
    require_dashboard_extra()  # installed here
    for module in ("dash", "plotly"):
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, module, None)
            with pytest.raises(MissingExtraError, match=r"pip install 'memprof\[dashboard\]'") as info:
                require_dashboard_extra()
        assert isinstance(info.value, MemprofError) and str(info.value) == DASHBOARD_EXTRA
