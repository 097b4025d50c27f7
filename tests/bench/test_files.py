"""The benchmark files: a malformed line is refused with its file and line number."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from memory_mcp.bench.fold import read_pairs
from memory_mcp.bench.retrieval import read_cases, read_run
from memory_mcp.errors import InvalidInput

CASE = {"case": "c-0", "memories": [], "queries": []}


def test_gzipped_and_plain_files_read_the_same(tmp_path: Path) -> None:
    plain, packed = tmp_path / "d.jsonl", tmp_path / "d.jsonl.gz"
    text = json.dumps(CASE) + "\n\n" + json.dumps({**CASE, "case": "c-1"}) + "\n"
    plain.write_text(text, encoding="utf-8")
    with gzip.open(packed, "wt", encoding="utf-8") as fh:
        fh.write(text)
    assert list(read_cases(plain)) == list(read_cases(packed))
    assert [c["case"] for c in read_cases(plain)] == ["c-0", "c-1"]  # the blank line is skipped


@pytest.mark.parametrize(
    ("reader", "good", "bad", "what"),
    [
        (read_cases, CASE, {"case": "c-1", "memories": "none"}, "not a benchmark case"),
        (read_run, {"case": "c", "query": "q", "ranked": []}, {"case": "c"}, "not a run line"),
        (read_pairs, {"a": "x", "b": "y", "label": "duplicate"}, {"a": "x"}, "not a fold pair"),
    ],
)
def test_a_malformed_line_is_named(
    tmp_path: Path, reader: object, good: object, bad: object, what: str
) -> None:
    path = tmp_path / "f.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(InvalidInput, match=rf"f\.jsonl:2: {what}"):
        list(reader(path))  # type: ignore[operator]
    path.write_text(json.dumps(good) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(InvalidInput, match=rf"f\.jsonl:2: {what}"):
        list(reader(path))  # type: ignore[operator]
