"""``memprof import-snapshot`` and ``memprof export-snapshot``: what they write, and one-line errors that change nothing."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from memprof import load_trace
from memprof.interop import load_snapshot, write_snapshot
from memprof.units import format_bytes
from tests.bad_input import cli_fails, run_cli
from tests.memprof.interop.snapshots import training_snapshot
from tests.memprof.interop.test_import import _two_devices


@pytest.fixture
def snapshot_file(tmp_path: Path) -> Path:
    return write_snapshot(tmp_path / "snapshot.pickle", training_snapshot().builder.snapshot())


def test_import_then_export(tmp_path, snapshot_file):
    out = tmp_path / "traces" / "steps"
    code, stdout, stderr = run_cli(["import-snapshot", str(snapshot_file), "--out", str(out)])
    assert code == 0, stderr
    assert f"wrote {out}: cuda:0, 2 iteration(s), peak {format_bytes(111104)} allocated in iteration 1 (backward)" \
        in stdout
    assert f"memprof dashboard {out.parent}" in stdout
    assert load_trace(out).meta["source_file"] == "snapshot.pickle"
    pickle_out = tmp_path / "back.pickle"
    code, stdout, stderr = run_cli(["export-snapshot", str(out), "--out", str(pickle_out)])
    assert code == 0, stderr
    assert "blocks live at the end" in stdout and "python -m torch.cuda._memory_viz trace_plot" in stdout
    assert load_snapshot(pickle_out)["device_traces"][0]
    code, _, stderr = run_cli(["import-snapshot", str(pickle_out), "--out", str(tmp_path / "again"), "--run-id", "x"])
    assert code == 0, stderr
    again = load_trace(tmp_path / "again")
    assert again.run_id == "x" and again.iterations.peak_allocated_bytes.tolist() == [88576, 111104]


def test_devices(tmp_path):
    source = write_snapshot(tmp_path / "two.pickle", _two_devices())
    code, stdout, _ = run_cli(["import-snapshot", str(source), "--out", str(tmp_path / "both")])
    assert code == 0 and stdout.count("wrote ") == 2 and "rank=1: cuda:1" in stdout
    code, stdout, _ = run_cli(["import-snapshot", str(source), "--out", str(tmp_path / "one"), "--device", "1"])
    assert code == 0 and load_trace(tmp_path / "one").meta["device"] == "cuda:1"


def test_import_refuses_bad_input_in_one_line(tmp_path, snapshot_file):
    out = tmp_path / "run"
    text = tmp_path / "notes.txt"
    text.write_text("not a pickle")
    assert "is not a readable pickle" in cli_fails("import-snapshot", ["import-snapshot", str(text), "--out",
                                                                       str(out)], tmp_path)
    assert "cannot read snapshot" in cli_fails("import-snapshot", ["import-snapshot", str(tmp_path / "absent"),
                                                                   "--out", str(out)], tmp_path)
    foreign = tmp_path / "foreign.pickle"
    foreign.write_bytes(pickle.dumps({"segments": []}))
    assert "lacks the key 'device_traces'" in cli_fails("import-snapshot", ["import-snapshot", str(foreign), "--out",
                                                                             str(out)], tmp_path)
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "f": print}))
    assert "refers to builtins.print" in cli_fails("import-snapshot", ["import-snapshot", str(evil), "--out",
                                                                        str(out)], tmp_path)
    assert "no entries or segments for device 4" in cli_fails(
        "import-snapshot", ["import-snapshot", str(snapshot_file), "--out", str(out), "--device", "4"], tmp_path)
    assert "--device" in cli_fails("import-snapshot", ["import-snapshot", str(snapshot_file), "--out", str(out),
                                                       "--device", "-1"], tmp_path)
    assert not out.exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "cannot write" in cli_fails("import-snapshot", ["import-snapshot", str(snapshot_file), "--out",
                                                           str(blocker / "run")], tmp_path)


def test_import_keeps_an_existing_run_unless_forced(tmp_path, snapshot_file):
    out = tmp_path / "run"
    assert run_cli(["import-snapshot", str(snapshot_file), "--out", str(out)])[0] == 0
    assert "pass --force" in cli_fails("import-snapshot", ["import-snapshot", str(snapshot_file), "--out", str(out)],
                                       tmp_path)
    one_step = write_snapshot(tmp_path / "one.pickle", training_snapshot(steps=1).builder.snapshot())
    assert run_cli(["import-snapshot", str(one_step), "--out", str(out), "--force"])[0] == 0
    assert len(load_trace(out).iterations) == 1


def test_export_refuses_bad_input_in_one_line(tmp_path, snapshot_file):
    run = tmp_path / "run"
    assert run_cli(["import-snapshot", str(snapshot_file), "--out", str(run)])[0] == 0
    out = tmp_path / "out.pickle"
    out.write_bytes(b"kept")
    assert "pass --force" in cli_fails("export-snapshot", ["export-snapshot", str(run), "--out", str(out)], tmp_path)
    assert "directory" in cli_fails("export-snapshot", ["export-snapshot", str(run), "--out",
                                                        str(tmp_path / "nowhere" / "x.pickle")], tmp_path)
    assert "is a directory" in cli_fails("export-snapshot", ["export-snapshot", str(run), "--out", str(run)], tmp_path)
    assert "no trace directory" in cli_fails("export-snapshot", ["export-snapshot", str(tmp_path / "absent"),
                                                                 "--out", str(tmp_path / "y.pickle")], tmp_path)
    assert run_cli(["export-snapshot", str(run), "--out", str(out), "--force"])[0] == 0
    assert load_snapshot(out)["segments"]
