"""The records' own behaviour: the carried blocks as one array (BlockTable)."""

from __future__ import annotations

import numpy as np

from memprof.analysis.records import BlockTable, CarriedState, LiveBlock, block_table


def test_a_block_table_reads_as_its_rows() -> None:
    rows = [LiveBlock(-1, 0x10, 64, 0), LiveBlock(7, 0x20, 8, 4), LiveBlock(8, 0x30, 16, 9)]
    table = BlockTable(block_table(rows))
    assert len(table) == 3 and list(table) == rows and table == rows and rows == list(table)
    assert table[1] == rows[1] and table[-1] == rows[-1] and table[1:] == rows[1:]
    assert all(type(v) is int for v in table[0])  # plain ints, as the sweep's lists hold
    assert block_table(table) is table.table  # no copy for the next iteration
    assert table != rows[:2] and table != [*rows[:2], LiveBlock(8, 0x30, 16, 8)]
    assert CarriedState(0, table, 9).allocated_bytes == 88 == CarriedState(0, rows, 9).allocated_bytes
    empty = BlockTable(np.zeros((0, 4), dtype=np.int64))
    assert len(empty) == 0 and list(empty) == [] and CarriedState(0, empty, 0).allocated_bytes == 0
