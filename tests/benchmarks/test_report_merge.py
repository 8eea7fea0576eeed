"""``python -m benchmarks --only NAME`` replaces its own sections of docs/benchmarks.md and keeps the rest."""

from __future__ import annotations

from benchmarks.__main__ import SECTIONS, merge_sections

REPORT = """# Benchmarks

- Date: then

## {profiler}

## Wall clock

old profiler table

## 1c. Written by hand

analysis

## {offload}

old offload table

**Reading.** kept with its section
"""


def report() -> str:
    return REPORT.format(profiler=SECTIONS["profiler"][0], offload=SECTIONS["offload"][0])


def test_a_section_run_alone_replaces_only_itself() -> None:
    title = SECTIONS["profiler"][0]
    merged = merge_sections(report(), {title: f"## {title}\n\nnew profiler table\n"})
    assert "old profiler table" not in merged and "## Wall clock" not in merged  # its own subheadings went too
    assert "new profiler table" in merged
    assert "## 1c. Written by hand\n\nanalysis" in merged and "old offload table" in merged
    assert merged.startswith("# Benchmarks\n\n- Date: then")


def test_a_new_section_is_appended_and_rerunning_it_replaces_it() -> None:
    title = SECTIONS["weights"][0]
    once = merge_sections(report(), {title: f"## {title}\n\nfirst\n"})
    assert once.startswith(report().rstrip("\n")) and once.endswith("first\n")
    twice = merge_sections(once, {title: f"## {title}\n\nsecond\n"})
    assert twice.count(f"## {title}") == 1 and "first" not in twice and twice.endswith("second\n")
