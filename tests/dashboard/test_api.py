"""The dashboard's and the command line's public names: sorted, all present, and ``import dashboard`` stays light."""

from __future__ import annotations

import subprocess
import sys

import cli
import dashboard


def test_every_public_name_resolves_and_the_lists_are_sorted() -> None:
    for package in (dashboard, cli):
        assert list(package.__all__) == sorted(package.__all__)
        for name in package.__all__:
            assert getattr(package, name) is not None


def test_importing_the_package_loads_neither_dash_nor_plotly() -> None:
    code = "import sys, dashboard; assert not {'dash', 'plotly'} & set(sys.modules), sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
