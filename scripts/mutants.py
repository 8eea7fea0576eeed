"""Deliberate breakages of the product that the test suite must catch: a mutation check.

Each mutation is one literal edit of one file (old text -> new text) that breaks a claim the README makes: a
memory category misfiled, a schedule not applied, the executor not installed, the simulator or the dynamic
programs off by one slot, a journal record lost, a steady record's sizes left out of the journal unchecked. For
each, the script copies the source tree to a temporary folder, applies the edit there (the working tree is never
touched), runs only the tests that should catch it (``pytest -x -q`` on named files or test ids) and reports
whether they did. A mutation the tests miss
*survived*: the claim is held by no test that can fail.

The old text must be found exactly once in the current tree: when the code it names is rewritten, the script
stops with the file and the text it looked for, so the check cannot rot into mutations that no longer apply.

Usage: ``python scripts/mutants.py`` (all), ``python scripts/mutants.py NAME ...`` (some), ``--list``.
Exit status: 0 when every mutation was caught, 1 when one survived, 2 when one no longer applies.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What the copy leaves out: the environment, version control, caches and recorded runs (none are sources).
IGNORED = (".git", ".venv", "venv", "traces", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache",
           "*.egg-info", "node_modules", ".hypothesis")


@dataclass(frozen=True)
class Mutation:
    """One deliberate breakage.

    Attributes:
        name: a short id (command-line argument).
        path: the file to edit, relative to the repository root.
        old: the text replaced; must occur exactly once in the file.
        new: what replaces it.
        tests: pytest arguments that select the tests which must catch it (files or test ids).
        claim: what the breakage makes false.
    """

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    claim: str


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        name="grads-filed-as-feature-maps",
        path="memprof/analysis/attribution.py",
        old="Mark.BWD_ENTER: GRADS, Mark.BWD_EXIT: GRADS}",
        new="Mark.BWD_ENTER: FEATURE, Mark.BWD_EXIT: FEATURE}",
        tests=("tests/memprof/test_category_oracles.py",),
        claim="activation gradients are filed as grads, not feature maps",
    ),
    Mutation(
        name="summary-without-the-forward-rule",
        path="memprof/analysis/summary.py",
        old="    _forward_rule(ranks, facts, made, paired, n_carried)\n",
        new="",
        tests=("tests/memprof/analysis/test_summary.py",),
        claim="an iteration that keeps no detail is attributed as its sweep would attribute it",
    ),
    Mutation(
        name="measure-without-the-schedule",
        path="planner/measure/runs.py",
        old="    apply_schedule(model, schedule, container, optimizer=optimizer)\n",
        new="",
        tests=("tests/planner/measure/test_measure.py",),
        claim="measure_schedule runs the schedule it compares",
    ),
    Mutation(
        name="executor-not-installed",
        path="planner/executor/apply.py",
        old="        executor.install()\n",
        new="        pass\n",
        tests=("tests/planner/executor/test_memory.py", "tests/planner/executor/test_apply.py"),
        claim="apply_schedule makes the model train with the schedule",
    ),
    Mutation(
        name="simulator-forgets-the-new-gradient",
        path="planner/simulation/memory_rules.py",
        old="during = self.live + regrown + grad_out - handed + spec.backward_overhead_with(option)",
        new="during = self.live + regrown - handed + spec.backward_overhead_with(option)",
        tests=("tests/planner/simulation/test_simulator.py", "tests/planner/solvers/test_solve.py"),
        claim="the simulator counts the gradient B(l) produces (one slot of memory)",
    ),
    Mutation(
        name="sizes-rounded-down-a-slot",
        path="planner/solvers/discretize.py",
        old='    return -(-int(size_bytes) // slot_bytes)\n',
        new='    return int(size_bytes) // slot_bytes\n',
        tests=("tests/planner/solvers/test_solve.py",),
        claim="the dynamic programs round sizes up to whole slots, so a schedule never exceeds its budget",
    ),
    Mutation(
        name="journal-record-lost",
        path="memprof/trace/pipeline/journal.py",
        old="        written = os.writev(fd, parts)\n",
        new="        written = os.writev(fd, parts) if record.iteration != 1 else total\n",
        tests=("tests/memprof/trace/pipeline/test_journal.py", "tests/memprof/capture/test_sinks.py"),
        claim="every recorded iteration reaches the journal and the trace",
    ),
    Mutation(
        name="steady-sizes-left-out-unchecked",
        path="memprof/trace/pipeline/payloads.py",
        old="    if template is None or not same_allocations(template, ev):",
        new="    if template is None:",
        tests=("tests/memprof/trace/pipeline/test_payloads.py",),
        claim="a steady record leaves its sizes out of the journal only where they are its template's",
    ),
    Mutation(
        name="stages-traced-by-compile",
        path="planner/executor/install.py",
        old="    return method if disable is None else disable(method)\n",
        new="    return method\n",
        tests=("tests/planner/executor/test_compile.py::"
               "test_compiled_schedules_give_the_compiled_models_gradients_bitwise[gpt2-rotor]",),
        claim="a compiled scheduled model gets the compiled model's gradients (dynamo must not trace the executor)",
    ),
    Mutation(
        name="schedule-applied-to-any-model",
        path="planner/executor/apply.py",
        old="    check_planned_model(model, schedule, container, strict)\n",
        new="",
        tests=("tests/planner/executor/test_planned_model.py::test_a_loop_model_with_another_depth_or_width_is_refused",),
        claim="a schedule refuses a model other than the one it was planned for (a deeper one would train wrongly)",
    ),
    Mutation(
        name="tied-embedding-rows-into-grad",
        path="planner/executor/embedding_grad.py",
        old="        if ctx.tied:",
        new="        if False:",
        tests=("tests/planner/executor/test_embedding_grad.py::test_gpt2_gradients_match_plain_autograd",),
        claim="under gradient accumulation a tied embedding's gradient is plain autograd's bitwise",
    ),
)


class MutationRotError(RuntimeError):
    """A mutation's old text is not found exactly once: the code it targets changed, and so must the mutation."""


def check_applies(root: Path, mutation: Mutation) -> str:
    """The text of ``mutation.path`` under ``root``, after checking the old text occurs in it exactly once.

    Raises:
        MutationRotError: the file is missing, or holds the old text zero or several times.
    """
    path = root / mutation.path
    if not path.is_file():
        raise MutationRotError(f"mutation {mutation.name!r}: {mutation.path} does not exist; update scripts/mutants.py")
    text = path.read_text()
    count = text.count(mutation.old)
    if count != 1:
        raise MutationRotError(
            f"mutation {mutation.name!r}: {mutation.path} holds its old text {count} times, expected once; "
            f"the code changed, so update the mutation in scripts/mutants.py. Old text: {mutation.old!r}"
        )
    return text


def apply(root: Path, mutation: Mutation) -> str:
    """Applies ``mutation`` to the tree at ``root``; returns the file's original text (for :func:`revert`)."""
    original = check_applies(root, mutation)
    (root / mutation.path).write_text(original.replace(mutation.old, mutation.new, 1))
    return original


def revert(root: Path, mutation: Mutation, original: str) -> None:
    """Puts back the file :func:`apply` changed."""
    (root / mutation.path).write_text(original)


def copy_tree(source: Path, destination: Path) -> Path:
    """Copies the sources under ``source`` to ``destination`` (created), leaving out :data:`IGNORED`."""
    shutil.copytree(source, destination, ignore=shutil.ignore_patterns(*IGNORED), symlinks=True)
    return destination


def _environment(root: Path) -> dict[str, str]:
    # The copy's packages must win over the editable install of the working tree: first on the path, and no
    # bytecode written next to them.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports_from(root: Path, python: str = sys.executable) -> None:
    """Raises ``RuntimeError`` unless Python started in ``root`` imports memprof and planner from ``root``."""
    code = "import memprof, planner; print(memprof.__file__); print(planner.__file__)"
    out = subprocess.run([python, "-c", code], cwd=root, env=_environment(root), capture_output=True, text=True,
                         check=True).stdout.split()
    if not all(Path(path).resolve().is_relative_to(root.resolve()) for path in out):
        raise RuntimeError(f"the copy in {root} imports the product from {out}: mutations would not be seen")


@dataclass(frozen=True)
class Outcome:
    """What running one mutation's tests gave."""

    mutation: Mutation
    caught: bool
    seconds: float
    detail: str  # the test that failed, when caught


def _pytest(root: Path, args: Sequence[str], python: str) -> subprocess.CompletedProcess[str]:
    # -m "": every named test, the slow ones too (pytest's own default leaves out those marked slow)
    return subprocess.run([python, "-m", "pytest", "-q", "-m", "", "-p", "no:cacheprovider", "--no-header", "-rf", *args],
                          cwd=root, env=_environment(root), capture_output=True, text=True)


def failed_test(output: str) -> str | None:
    """The first failed test's id in pytest's short summary (``FAILED tests/x.py::test_y[z] - ...``), if any."""
    for line in output.splitlines():
        if line.startswith("FAILED "):
            return line[len("FAILED "):].split(" - ", 1)[0].strip()
    return None


def run_mutation(root: Path, mutation: Mutation, python: str = sys.executable) -> Outcome:
    """Applies ``mutation`` in the copy at ``root``, runs its tests (stopping at the first failure), reverts it.

    Caught means a test failed with the mutation and passes without it: the failing test is run again on the
    reverted tree, so a test that fails anyway (a broken tree, a flaky test) is not taken for a catch.

    Raises:
        RuntimeError: pytest could not judge (collection or usage error), or the failing test fails unmutated.
    """
    original = apply(root, mutation)
    start = time.perf_counter()
    try:
        result = _pytest(root, ["-x", *mutation.tests], python)
    finally:
        revert(root, mutation, original)
    if result.returncode not in (0, 1):  # 2+: interrupted, usage or collection error: nothing was judged
        raise RuntimeError(f"mutation {mutation.name!r}: pytest exited {result.returncode}:\n"
                           f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
    failed = failed_test(result.stdout)
    if result.returncode == 1:
        if failed is None:
            raise RuntimeError(f"mutation {mutation.name!r}: pytest failed without naming a test:\n"
                               f"{result.stdout[-3000:]}")
        again = _pytest(root, [failed], python)
        if again.returncode != 0:
            raise RuntimeError(f"mutation {mutation.name!r}: {failed} fails without the mutation too, so it "
                               f"proves nothing; fix it first:\n{again.stdout[-3000:]}")
    return Outcome(mutation, result.returncode == 1, time.perf_counter() - start, failed or "")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the selected mutations (all by default) and prints which were caught; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = parser.parse_args(argv)
    known = {m.name: m for m in MUTATIONS}
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name}: {m.path} ({m.claim}); tests: {' '.join(m.tests)}")
        return 0
    unknown = [name for name in args.names if name not in known]
    if unknown:
        parser.error(f"unknown mutations {unknown}; expected some of {sorted(known)}")
    chosen = [known[name] for name in args.names] or list(MUTATIONS)
    try:
        for mutation in chosen:  # every mutation still applies, before any time is spent
            check_applies(ROOT, mutation)
    except MutationRotError as exc:
        print(f"mutants: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    survived = []
    with tempfile.TemporaryDirectory(prefix="memprof-mutants-") as tmp:
        copy = copy_tree(ROOT, Path(tmp) / "tree")
        check_imports_from(copy)
        for mutation in chosen:
            outcome = run_mutation(copy, mutation)
            verdict = "caught  " if outcome.caught else "SURVIVED"
            print(f"{verdict} {mutation.name} ({outcome.seconds:.0f} s): {mutation.claim}"
                  + (f"\n         by {outcome.detail}" if outcome.caught else ""), flush=True)
            if not outcome.caught:
                survived.append(mutation.name)
    total = time.perf_counter() - start
    if survived:
        print(f"mutants: {len(survived)} of {len(chosen)} survived ({', '.join(survived)}): no test failed when "
              f"the product broke; {total:.0f} s", file=sys.stderr)
        return 1
    print(f"mutants: all {len(chosen)} caught in {total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
