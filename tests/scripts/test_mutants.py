"""The mutation check's own parts (``scripts/mutants.py``): cheap checks that it cannot rot silently.

Running the mutations takes minutes and is ``make mutants`` (called by ``make test``); here, only that each
mutation still applies to the current tree exactly once, names tests that exist, and that applying and
reverting an edit leaves a file as it was.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.scripts import ROOT, load_script

mutants = load_script("mutants")
NAMES = [m.name for m in mutants.MUTATIONS]


def test_the_issues_breakages_are_all_there() -> None:
    assert len(set(NAMES)) == len(NAMES) >= 5
    paths = {m.path for m in mutants.MUTATIONS}
    assert {"memprof/analysis/attribution.py", "planner/measure/runs.py", "planner/executor/apply.py",
            "planner/simulation/memory_rules.py", "memprof/trace/pipeline/journal.py"} <= paths


@pytest.mark.parametrize("mutation", mutants.MUTATIONS, ids=NAMES)
def test_each_mutation_applies_to_the_current_tree_exactly_once(mutation) -> None:  # noqa: ANN001
    text = mutants.check_applies(ROOT, mutation)
    assert mutation.new != mutation.old
    mutated = text.replace(mutation.old, mutation.new, 1)
    assert mutated != text
    if mutation.path.endswith(".py"):
        ast.parse(mutated)  # a mutation breaks behaviour, not syntax: the tests must run to catch it


@pytest.mark.parametrize("mutation", mutants.MUTATIONS, ids=NAMES)
def test_each_mutation_names_tests_that_exist(mutation) -> None:  # noqa: ANN001
    assert mutation.tests
    for target in mutation.tests:
        path, _, name = target.partition("::")
        assert (ROOT / path).is_file(), target
        if name:
            assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), target


def test_a_mutation_whose_code_changed_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("x = 1\nx = 1\n")
    twice = mutants.Mutation("twice", "pkg/mod.py", "x = 1\n", "x = 2\n", ("t.py",), "x is 1")
    gone = mutants.Mutation("gone", "pkg/mod.py", "y = 1\n", "y = 2\n", ("t.py",), "y is 1")
    missing = mutants.Mutation("missing", "pkg/nothing.py", "y", "z", ("t.py",), "y")
    with pytest.raises(mutants.MutationRotError, match="'twice'.*2 times, expected once"):
        mutants.check_applies(tmp_path, twice)
    with pytest.raises(mutants.MutationRotError, match="'gone'.*0 times.*update the mutation"):
        mutants.check_applies(tmp_path, gone)
    with pytest.raises(mutants.MutationRotError, match="'missing'.*does not exist"):
        mutants.check_applies(tmp_path, missing)


# Source text: any character but NUL (the marker's frame), lone surrogates (not UTF-8) and CR (read back as LF).
_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x00"), max_size=40)


@given(before=_TEXT, after=_TEXT, new=_TEXT)
def test_apply_then_revert_gives_the_file_back(tmp_path_factory: pytest.TempPathFactory, before: str, after: str,
                                                new: str) -> None:
    old = "\x00MUTATE\x00"  # found exactly once: the drawn text holds no NUL
    root = tmp_path_factory.mktemp("tree")
    path = root / "f.py"
    path.write_text(before + old + after)
    mutation = mutants.Mutation("m", "f.py", old, new, ("t.py",), "c")
    original = mutants.apply(root, mutation)
    assert path.read_text() == before + new + after
    mutants.revert(root, mutation, original)
    assert path.read_text() == before + old + after


def test_the_copy_leaves_out_the_environment_and_keeps_the_sources(tmp_path: Path) -> None:
    source = tmp_path / "repo"
    for name in ("memprof/a.py", ".venv/lib/x.py", ".git/HEAD", "traces/run/meta.json", "memprof/__pycache__/a.pyc",
                 "tests/t.py"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text("1")
    copy = mutants.copy_tree(source, tmp_path / "copy")
    found = sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file())
    assert found == ["memprof/a.py", "tests/t.py"]


def test_make_test_runs_the_mutation_check() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "scripts/mutants.py" in makefile
    test_target = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "mutants" in test_target
