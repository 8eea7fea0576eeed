"""Reading snapshot files: only dicts of builtins load; everything else is refused with one clear line."""

from __future__ import annotations

import copy
import pickle
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memprof import MemprofError, SnapshotFormatError
from memprof.interop import import_snapshot, load_snapshot, write_snapshot
from tests.bad_input import BAD_VALUES, CASES, FUZZ, NOTED, api_error
from tests.memprof.interop.snapshots import training_snapshot


def _dump(path: Path, value: object, protocol: int = 4) -> Path:
    path.write_bytes(pickle.dumps(value, protocol=protocol))
    return path


class _Payload:
    """Unpickling this runs ``os.system`` (what a malicious snapshot would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_snapshot_round_trips_through_the_file(tmp_path):
    snapshot = training_snapshot().builder.snapshot()
    write_snapshot(tmp_path / "s.pickle", snapshot)
    assert load_snapshot(tmp_path / "s.pickle") == snapshot
    # protocol 2 spells tuples and sets with opcodes and globals the reader allows
    legacy = {**snapshot, "extra": {1, 2}}
    assert load_snapshot(_dump(tmp_path / "p2.pickle", legacy, protocol=2))["extra"] == {1, 2}


@pytest.mark.parametrize(("content", "fragment"), [
    (b"", "not a readable pickle"),
    (b"hello, not a pickle at all", "not a readable pickle"),
    (b"\x80\x04\x95", "not a readable pickle"),  # truncated
])
def test_files_that_are_not_pickles_are_refused(tmp_path, content, fragment):
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    error = api_error("snapshot-file", lambda: load_snapshot(path), SnapshotFormatError)
    assert fragment in str(error) and str(path) in str(error)
    assert len(str(error).splitlines()) == 1


def test_a_missing_file_is_a_memprof_error(tmp_path):
    error = api_error("snapshot-file", lambda: load_snapshot(tmp_path / "absent.pickle"), SnapshotFormatError)
    assert "cannot read snapshot" in str(error)


def test_a_pickle_naming_code_is_refused_before_anything_runs(tmp_path):
    marker = tmp_path / "ran"
    path = _dump(tmp_path / "evil.pickle", {"segments": [], "device_traces": [], "x": _Payload(marker)})
    error = api_error("snapshot-file", lambda: load_snapshot(path), SnapshotFormatError)
    assert "refers to posix.system" in str(error) or "refers to os.system" in str(error)
    assert not marker.exists()
    # even a harmless-looking builtin is refused: only set and frozenset may be named
    path = _dump(tmp_path / "eval.pickle", {"f": eval}, protocol=4)
    assert "refers to builtins.eval" in str(api_error("snapshot-file", lambda: load_snapshot(path),
                                                      SnapshotFormatError))


@pytest.mark.parametrize(("value", "fragment"), [
    ([{"address": 0}], "torch.cuda.memory_snapshot()"),
    (42, "holds a int"),
    ({"segments": []}, "lacks the key 'device_traces'"),
    ({"device_traces": []}, "lacks the key 'segments'"),
    ({"segments": {}, "device_traces": []}, "'segments' must be a list"),
    ({"segments": [], "device_traces": [{}]}, "device_traces[0] must be a list"),
    ({"segments": [{"total_size": 5}], "device_traces": []}, "segments[0] lacks 'address'"),
    ({"segments": [{"address": 0, "total_size": -1}], "device_traces": []}, "'total_size' must be a whole number"),
    ({"segments": [{"address": 0, "total_size": 8, "blocks": [{"size": 8, "state": "odd"}]}], "device_traces": []},
     "'state' must be one of"),
    ({"segments": [], "device_traces": [[{"addr": 1}]]}, "lacks an 'action' string"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1}]]}, "(alloc) lacks 'size'"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": "8"}]]}, "'size' must be a whole"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 8, "frames": "x"}]]},
     "'frames' must be a list"),
])
def test_pickles_that_are_not_snapshots_name_the_field(tmp_path, value, fragment):
    path = _dump(tmp_path / "foreign.pickle", value)
    error = api_error("snapshot-file", lambda: load_snapshot(path), SnapshotFormatError)
    assert fragment in str(error), str(error)
    assert len(str(error).splitlines()) == 1
    # the importer refuses the same way and writes nothing
    with pytest.raises(MemprofError):
        import_snapshot(path, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["foreign.pickle"]


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    """Every key or index path into a nest of dicts and lists."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


_SMALL = training_snapshot(steps=1).builder.snapshot()
_PATHS = _paths(_SMALL)


@FUZZ
@given(data=st.data())
def test_a_damaged_snapshot_imports_or_is_refused_in_one_line(data):
    """Any field replaced by a bad value, or deleted: the import works or raises a memprof error, nothing else."""
    snapshot = copy.deepcopy(_SMALL)
    path = data.draw(st.sampled_from(_PATHS))
    parent = snapshot
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(st.sampled_from(BAD_VALUES + [-(2**70), 2**70, "alloc", [{}], {"a": 1}]))
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "s.pickle"
        file.write_bytes(pickle.dumps(snapshot, protocol=4))
        CASES["damaged snapshot"] += 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # repairs of inconsistent segments
                import_snapshot(file, Path(tmp) / "run")
        except MemprofError as exc:
            assert len(str(exc).splitlines()) == 1
            assert not (Path(tmp) / "run").exists()
            NOTED["damaged snapshot refused"] += 1
