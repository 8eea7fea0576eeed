"""``memprof dashboard``: arguments and defaults, bad values as one line, the missing extra."""

from __future__ import annotations

import argparse
import socket
import sys

import pytest

import cli.dashboard
from cli.main import main
from tests.cli.helpers import exit_code, one_line_error


def _parse(argv):
    parser = argparse.ArgumentParser()
    cli.dashboard.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["dashboard", *argv])


def test_defaults():
    args = _parse([])
    assert (args.traces_dir, args.host, args.port, args.open) == ("traces", "127.0.0.1", 8050, False)
    args = _parse(["runs", "--port", "9000", "--host", "0.0.0.0"])
    assert (args.traces_dir, args.host, args.port) == ("runs", "0.0.0.0", 9000)


def test_cli_dispatches_to_dashboard(monkeypatch, tmp_path):
    called = {}
    monkeypatch.setattr(cli.dashboard, "serve", lambda *a, **k: called.update(args=a, kwargs=k))
    assert main(["dashboard", str(tmp_path), "--port", "8999"]) == 0
    assert called["args"] == (str(tmp_path), "127.0.0.1", 8999)


@pytest.mark.parametrize("port", ["http", "80.5", "0", "65536", "-1", ""])
def test_bad_port_is_one_line(monkeypatch, tmp_path, capsys, port):
    monkeypatch.setattr(cli.dashboard, "serve", lambda *a, **k: pytest.fail("served"))
    assert exit_code(["dashboard", str(tmp_path), f"--port={port}"]) == 2
    one_line_error(capsys, "memprof dashboard: error: argument --port: must be a whole number between 1 and 65535")


def test_port_in_use_is_one_line(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["dashboard", str(tmp_path), "--port", str(port)]) == 2
    one_line_error(capsys, f"memprof dashboard: error: cannot serve on 127.0.0.1:{port}:", "--port")


def test_unknown_host_is_one_line(tmp_path, capsys):
    with pytest.warns(UserWarning, match="other machines can reach"):
        assert main(["dashboard", str(tmp_path), "--host", "no-such-host.invalid"]) == 2
    one_line_error(capsys, "memprof dashboard: error: cannot serve on no-such-host.invalid:8050", "--host")


def test_without_the_dashboard_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "dash", None)  # `import dash` fails as if it were not installed
    monkeypatch.setattr(cli.dashboard, "serve", lambda *a, **k: pytest.fail("served"))
    assert main(["dashboard", str(tmp_path)]) == 2
    assert one_line_error(capsys) == ("memprof dashboard: error: the dashboard needs the dashboard extra: "
                                      "pip install 'memprof[dashboard]'")
