"""Serving the dashboard: loopback warning, URL, a port that is bad or taken, the offline app."""

from __future__ import annotations

import socket
import warnings

import pytest

from dashboard import server
from dashboard.app import create_app
from memprof.errors import MemprofError


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                                ("127.0.0.2", True), ("0.0.0.0", False), ("192.168.1.4", False),
                                                ("example.org", False)])
def test_is_loopback(host, loopback):
    assert server.is_loopback(host) is loopback


def test_url():
    assert server.dashboard_url("127.0.0.1", 8050) == "http://127.0.0.1:8050/"
    assert server.dashboard_url("0.0.0.0", 80) == "http://127.0.0.1:80/"
    assert server.dashboard_url("::1", 8050) == "http://[::1]:8050/"


def test_serve_prints_url_and_warns_off_loopback(monkeypatch, capsys, tmp_path):
    served = {}
    monkeypatch.setattr("dash.Dash.run", lambda self, host, port, debug: served.update(host=host, port=port))
    monkeypatch.setattr(server, "check_can_listen", lambda host, port: None)  # never binds: run is patched
    with pytest.warns(UserWarning, match="other machines can reach"):
        server.serve(tmp_path, host="0.0.0.0", port=8123)
    assert served == {"host": "0.0.0.0", "port": 8123}
    assert "http://127.0.0.1:8123/" in capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        server.serve(tmp_path, host="127.0.0.1", port=8124)


def test_serve_refuses_bad_port(tmp_path):
    with pytest.raises(ValueError, match="between 1 and 65535"):
        server.serve(tmp_path, port=70000)


def test_serve_refuses_a_taken_port(monkeypatch, tmp_path):
    monkeypatch.setattr("dash.Dash.run", lambda *a, **k: pytest.fail("served"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(server.ServeError, match=f"cannot serve on 127.0.0.1:{port}: .*--port") as info:
            server.serve(tmp_path, port=port)
    assert isinstance(info.value, MemprofError)


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
