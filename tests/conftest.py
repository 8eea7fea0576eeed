"""Shared pytest set-up: GPU tests skip cleanly without CUDA; each test gives torch's thread count back."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# The bad-input tests of every package share their checks and a profiled run to damage.
pytest_plugins = ["tests.bad_input"]


@pytest.fixture(autouse=True)
def _intra_op_threads_given_back():
    """Every test ends with torch's intra-op thread count as it began: a test that sets one thread and keeps it
    would make the tests after it in the same worker profile other bytes (oneDNN sizes some kernels' workspace by
    the thread count, so a planner test's chain, minimum and chosen options would depend on the test order)."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
