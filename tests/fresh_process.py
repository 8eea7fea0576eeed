"""Runs a test in an interpreter of its own: for what depends on the process's dynamo state.

Profiling a compiled model gives the costing iterations' graph breaks to dynamo, which frames after them it
compiles depends on what ran before in the process (a logged warning that broke a graph the first time it was
issued, other tests' compiled code): measured in the suite after other compiled tests, a costing iteration of the
test GPT-2 ran its head eagerly (5,899,528 B for 5,183,348 compiled) where a process of its own, as a user's
training script, ran it compiled. Such tests run again in a fresh interpreter, where they measure what a user's
process would.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_FRESH = "MEMPROF_TEST_FRESH_PROCESS"


def in_fresh_process(request: pytest.FixtureRequest) -> bool:
    """Whether this test runs in a process of its own; if not, runs it in one and reports its outcome.

    Call first in the test: ``if not in_fresh_process(request): return``.

    Raises:
        pytest.fail.Exception: the test failed in its own process (its output is the message).
    """
    if os.environ.get(_FRESH) == request.node.nodeid:
        return True
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "slow or not slow",
                           request.node.nodeid], capture_output=True, text=True, cwd=request.config.rootpath,
                          env={**os.environ, _FRESH: request.node.nodeid})
    if done.returncode != 0:
        pytest.fail(f"in a process of its own:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}", pytrace=False)
    return False
