"""The in-memory vector copy finds rows by rowid whatever order they were written in."""

from __future__ import annotations

import numpy as np
import pytest

from memory_mcp.storage.sqlite.dense import _Segment

pytestmark = pytest.mark.sqlite_only


def _rows(rowids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n = len(rowids)
    vectors = np.eye(n, 8, dtype=np.float32) + 0.01
    return (
        np.asarray(rowids, np.int64),
        np.zeros(n, np.int16),
        np.zeros(n, np.int16),
        vectors,
    )


def test_find_sees_appends_drops_and_rows_written_again() -> None:
    segment = _Segment(8)
    segment.append(*_rows([64, 65, 128, 192]))
    assert sorted(segment.rowid[segment.find(np.array([65, 192, 999]))].tolist()) == [65, 192]
    segment.drop(np.array([1]))  # the record with seq 1: rows 64 and 65
    assert segment.find(np.array([64, 65])).tolist() == []
    segment.append(*_rows([65, 64]))  # written again, after the others
    found = segment.find(np.array([64, 65, 128]))
    assert sorted(segment.rowid[found].tolist()) == [64, 65, 128]
    assert all(segment.rowid[found] >= 0)
    assert segment.find(np.array([], np.int64)).tolist() == []
