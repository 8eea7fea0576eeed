"""The ``memprof dashboard`` command: arguments, defaults, loopback warning, offline app."""

from __future__ import annotations

import argparse
import warnings

import pytest

from dashboard import commands
from dashboard.app import create_app


def _parse(argv):
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["dashboard", *argv])


def test_defaults():
    args = _parse([])
    assert (args.traces_dir, args.host, args.port, args.open) == ("traces", "127.0.0.1", 8050, False)
    args = _parse(["runs", "--port", "9000", "--host", "0.0.0.0"])
    assert (args.traces_dir, args.host, args.port) == ("runs", "0.0.0.0", 9000)


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                                ("127.0.0.2", True), ("0.0.0.0", False), ("192.168.1.4", False),
                                                ("example.org", False)])
def test_is_loopback(host, loopback):
    assert commands.is_loopback(host) is loopback


def test_url():
    assert commands.dashboard_url("127.0.0.1", 8050) == "http://127.0.0.1:8050/"
    assert commands.dashboard_url("0.0.0.0", 80) == "http://127.0.0.1:80/"
    assert commands.dashboard_url("::1", 8050) == "http://[::1]:8050/"


def test_serve_prints_url_and_warns_off_loopback(monkeypatch, capsys, tmp_path):
    served = {}
    monkeypatch.setattr("dash.Dash.run", lambda self, host, port, debug: served.update(host=host, port=port))
    with pytest.warns(UserWarning, match="other machines can reach"):
        commands.serve(tmp_path, host="0.0.0.0", port=8123)
    assert served == {"host": "0.0.0.0", "port": 8123}
    assert "http://127.0.0.1:8123/" in capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        commands.serve(tmp_path, host="127.0.0.1", port=8124)


def test_serve_refuses_bad_port(tmp_path):
    with pytest.raises(ValueError, match="between 1 and 65535"):
        commands.serve(tmp_path, port=70000)


def test_cli_dispatches_to_dashboard(monkeypatch, tmp_path):
    from dashboard.cli import main

    called = {}
    monkeypatch.setattr(commands, "serve", lambda *a, **k: called.update(args=a, kwargs=k))
    assert main(["dashboard", str(tmp_path), "--port", "8999"]) == 0
    assert called["args"] == (str(tmp_path), "127.0.0.1", 8999)


def test_app_serves_assets_locally(traces):
    app = create_app(traces.root)
    assert app.config.serve_locally and app.scripts.config.serve_locally and app.css.config.serve_locally
    client = app.server.test_client()
    page = client.get("/").get_data(as_text=True)
    assert "cdn" not in page.lower() and "unpkg" not in page.lower()
    assert "/_dash-component-suites/" in page
    scripts = [s.split('"')[0] for s in page.split('src="')[1:]]
    assert scripts and all(s.startswith("/") for s in scripts)
    for src in scripts:
        assert client.get(src).status_code == 200, src
    assert client.get("/assets/style.css").status_code == 200
