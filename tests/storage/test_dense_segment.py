"""The in-memory vector copy finds rows by rowid whatever order they were written in,
clusters large scopes, and keeps their codes in a file."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from memory_mcp.storage.base import ivf_lists
from memory_mcp.storage.sqlite import dense
from memory_mcp.storage.sqlite.dense import _Segment

pytestmark = pytest.mark.sqlite_only


@pytest.fixture(params=["memory", "file"])
def folder(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """Where a large segment keeps its codes: nowhere (memory), or a file in a folder."""
    return tmp_path if request.param == "file" else None


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


def _clustered_rows(count: int, dim: int, seed: int) -> np.ndarray:
    """Unit vectors around 40 centres, as embeddings of a project's memories gather."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(40, dim))
    rows = centres[rng.integers(0, 40, count)] + 0.35 * rng.normal(size=(count, dim))
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _fill(segment: _Segment, vectors: np.ndarray, first_seq: int) -> None:
    n = len(vectors)
    rowids = (np.arange(first_seq, first_seq + n, dtype=np.int64)) * dense.MAX_PASSAGES
    segment.append(rowids, np.zeros(n, np.int16), np.zeros(n, np.int16), vectors)


def _clustered_segment(
    monkeypatch: pytest.MonkeyPatch, rows: int, probes: int, seed: int, folder: Path | None
) -> _Segment:
    """A segment of ``rows`` clustered rows, clustered, whose searches score ``probes``."""
    monkeypatch.setattr(dense, "CLUSTER_FROM", 1000)
    monkeypatch.setattr(dense, "IVF_PROBES", probes)
    monkeypatch.setattr(dense, "PROBE_ROWS", 1)  # the clusters' count, not their size, sets it
    segment = _Segment(24, folder)
    _fill(segment, _clustered_rows(rows, 24, seed=seed), first_seq=1)
    assert segment.codes.in_file == (folder is not None)
    assert segment.probe(np.ones(24, np.float32) / np.sqrt(24)) is None  # not clustered yet
    _clustered(segment)
    return segment


def _clustered(segment: _Segment) -> None:
    assert segment.wants_clusters
    segment.start_clustering()
    job = segment._clustering
    assert job is not None
    job.thread.join(60)
    assert segment.settle() is False and segment.centroids is not None


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no thread priorities here")
def test_a_clustering_runs_niced_and_leaves_the_callers_priority_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The clustering thread yields the cores (``background``: niceness 19 on Linux)."""
    import sys
    import threading

    seen: list[int] = []
    cluster = dense.cluster

    def watched(*args: object) -> object:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return cluster(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(dense, "cluster", watched)
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    _clustered_segment(monkeypatch, 1500, 4, seed=2, folder=None)
    assert seen and os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    if sys.platform == "linux":
        assert seen == [max(before, dense.BACKGROUND_NICE)]


def test_a_clustered_segment_scores_a_few_clusters_and_finds_the_exact_top(
    monkeypatch: pytest.MonkeyPatch, folder: Path | None
) -> None:
    segment = _clustered_segment(monkeypatch, 4000, probes=8, seed=1, folder=folder)
    cells = segment.cell[: segment.size]
    assert (np.diff(cells) >= 0).all() and cells.max() < segment.clusters  # ordered, no tail
    assert segment.clusters == ivf_lists(4000) == 98

    queries = _clustered_rows(50, 24, seed=2)
    recall = []
    for query in queries:
        probed = segment.probe(query)
        assert probed is not None
        positions, sims, _ = probed
        assert len(positions) < segment.size / 4  # a few clusters, not every row
        exact = segment.cosines(query)
        truth = _true_cosines(segment, query, positions)
        assert np.abs(sims - truth).max() <= _APPROX  # the cosines every row alone has
        assert np.abs(exact[positions] - truth).max() <= _APPROX
        best = set(np.argsort(-exact)[:20].tolist())
        found = set(positions[np.argsort(-sims)[:20]].tolist())
        recall.append(len(best & found) / 20)
    assert np.mean(recall) >= 0.95


def test_a_scope_of_small_clusters_probes_more_of_them(
    monkeypatch: pytest.MonkeyPatch, folder: Path | None
) -> None:
    """Recall falls where clusters are small (10,000 memories: 96 rows a cluster, 0.977
    of the exact top 50 records from 48 probes): a search scores ``PROBE_ROWS`` rows a
    probe at least, so more clusters there, and as many as asked where they are large."""
    assert dense.probed_clusters(48, 22_346, 232) == 128  # the bench's 10,000 memories
    assert dense.probed_clusters(24, 22_346, 232) == 64  # the write path's read there
    assert dense.probed_clusters(48, 174_197, 647) == 48  # 50,000
    assert dense.probed_clusters(48, 442_041, 1_031) == 48  # 200,000
    assert dense.probed_clusters(48, 4_000, 60) == 60  # never more than there are
    segment = _clustered_segment(monkeypatch, 4000, probes=8, seed=1, folder=folder)
    monkeypatch.setattr(dense, "PROBE_ROWS", 80)  # clusters of about 41 rows: twice as many
    clustered = int(segment.starts[segment.clusters])
    probes = dense.probed_clusters(8, clustered, segment.clusters)
    assert probes == math.ceil(8 * 80 * segment.clusters / clustered) > 8
    sizes = np.diff(segment.starts[: segment.clusters + 1])
    for query in _clustered_rows(5, 24, seed=3):
        probed = segment.probe(query)
        assert probed is not None
        nearest_first = np.argsort(-(segment.centroids @ query))
        assert len(probed[0]) == sizes[nearest_first[:probes]].sum()  # the nearest clusters


def test_the_rows_a_filter_keeps_score_as_every_row_does(
    monkeypatch: pytest.MonkeyPatch, folder: Path | None
) -> None:
    """``cosines_at`` (an exact search's rows of one kind) gives the cosines ``cosines``
    gives those rows, over several gathered blocks, from memory and from a file."""
    monkeypatch.setattr(dense, "_GATHER_BLOCK", 256)
    segment = _Segment(24, folder)
    vectors = _clustered_rows(3000, 24, seed=5)
    rowids = np.arange(1, 3001, dtype=np.int64) * dense.MAX_PASSAGES
    kinds = (np.arange(3000) % 5 == 0).astype(np.int16)  # a fifth of the rows: kind 1
    segment.append(rowids, np.zeros(3000, np.int16), kinds, vectors)
    segment.drop(np.array([6, 11]))  # two rows of kind 1 dropped
    kind_ok = np.array([False, True])
    keep = segment.passing(np.array([True, False]), kind_ok, slice(0, segment.size))
    positions = np.flatnonzero(keep)
    assert len(positions) == 598 > 2 * dense._GATHER_BLOCK
    assert (segment.kind[positions] == 1).all() and (segment.rowid[positions] >= 0).all()
    query = vectors[7]
    gathered = segment.cosines_at(query, positions)
    truth = _true_cosines(segment, query, positions)
    assert np.abs(gathered - truth).max() <= _APPROX
    assert np.abs(segment.cosines(query)[positions] - truth).max() <= _APPROX


# The first pass of a ranking scores int8 rows against an int8 copy of the query: off
# by about step / 3.5 (step: the query's largest coordinate / 127) for 24 dimensions;
# at 384 (all-MiniLM-L6-v2) at most 2e-3 over 110,000 rows.
_APPROX = 6e-3


def _true_cosines(segment: _Segment, query: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The rows' cosines with the float32 query: what scoring each row alone gives."""
    result: np.ndarray = segment.vectors(positions) @ (query / np.linalg.norm(query))
    return result


@pytest.mark.parametrize("how", ["every row", "clusters", "gathered"])
def test_a_rankings_best_rows_have_their_exact_cosines(
    monkeypatch: pytest.MonkeyPatch, folder: Path | None, how: str
) -> None:
    """Every row is scored against an int8 copy of the query, to about 1e-3; the best
    ``EXACT_TOP`` are then scored again with the float32 query: what a search returns
    and orders by is exact, and the best rows are the exact best."""
    monkeypatch.setattr(dense, "EXACT_TOP", 40)
    monkeypatch.setattr(dense, "_EXACT_BLOCK", 16)  # several blocks of the exact pass
    monkeypatch.setattr(dense, "_GATHER_BLOCK", 128)
    segment = _clustered_segment(monkeypatch, 4000, probes=8, seed=3, folder=folder)
    for query in _clustered_rows(20, 24, seed=4):
        if how == "every row":
            positions = np.arange(segment.size, dtype=np.int64)
            sims = segment.cosines(query)
        elif how == "clusters":
            probed = segment.probe(query)
            assert probed is not None
            positions, sims, _ = probed
        else:
            positions = np.arange(0, segment.size, 3, dtype=np.int64)
            sims = segment.cosines_at(query, positions)
        truth = _true_cosines(segment, query, positions)
        assert np.abs(sims - truth).max() <= _APPROX
        assert np.abs(sims - truth).max() > 1e-6  # the first pass is not exact...
        # ...its best rows are, well inside the EXACT_TOP rescored (a row past them
        # may still be put up to their last ones by the first pass's error)
        best = np.argsort(-sims)[:20]
        assert np.allclose(sims[best], truth[best], rtol=0, atol=1e-6)
        assert set(best.tolist()) == set(np.argsort(-truth)[:20].tolist())


def test_rows_written_after_the_clustering_are_scored_in_the_tail(
    monkeypatch: pytest.MonkeyPatch, folder: Path | None
) -> None:
    segment = _clustered_segment(monkeypatch, 3000, probes=4, seed=3, folder=folder)
    fresh = _clustered_rows(5, 24, seed=4)
    _fill(segment, fresh, first_seq=10_000)
    for n, query in enumerate(fresh):
        probed = segment.probe(query)
        assert probed is not None
        positions, sims, _ = probed
        best = positions[int(np.argmax(sims))]
        assert int(segment.rowid[best]) == (10_000 + n) * dense.MAX_PASSAGES
    # a fiftieth of the rows in the tail asks for another clustering
    _fill(segment, _clustered_rows(50, 24, seed=5), first_seq=20_000)
    assert not segment.wants_clusters  # 55 of 3,055 rows
    _fill(segment, _clustered_rows(10, 24, seed=6), first_seq=21_000)
    assert segment.wants_clusters  # 65 of 3,065


def test_a_tail_row_is_scored_by_the_searches_that_probe_its_nearest_cluster(
    monkeypatch: pytest.MonkeyPatch, folder: Path | None
) -> None:
    """A row written after the clustering is marked with its nearest cluster; a search
    scores the tail rows of the clusters it probes, and those of no known cluster,
    not the whole tail."""
    segment = _clustered_segment(monkeypatch, 3000, probes=4, seed=3, folder=folder)
    monkeypatch.setattr(dense, "EXACT_TOP", 8)  # the tail's rows scored by the int8 pass too
    clusters, tail = segment.clusters, 3000
    fresh = _clustered_rows(60, 24, seed=8)
    _fill(segment, fresh[:5], first_seq=10_000)  # a store's few rows: numkong's kernels
    _fill(segment, fresh[5:], first_seq=10_005)  # many at once: numpy's product
    assert segment.centroids is not None
    nearest = np.argmax(fresh @ segment.centroids.T, axis=1)
    assert segment.cell[tail : segment.size].tolist() == (clusters + 1 + nearest).tolist()
    segment.cell[tail + 59] = clusters  # a row of no known cluster (an older kept copy's)
    probes = dense.probed_clusters(4, tail, clusters)
    for n, query in enumerate(fresh[:20]):
        probed = segment.probe(query)
        assert probed is not None
        positions, sims, _ = probed
        near = set(np.argpartition(-(segment.centroids @ query), probes)[:probes].tolist())
        wanted = {tail + i for i in range(59) if int(nearest[i]) in near} | {tail + 59}
        assert set(positions[positions >= tail].tolist()) == wanted
        assert int(nearest[n]) in near  # a row's own cluster is among those nearest it
        best = positions[int(np.argmax(sims))]
        assert int(segment.rowid[best]) == (10_000 + n) * dense.MAX_PASSAGES
        truth = _true_cosines(segment, query, positions)
        assert np.abs(sims - truth).max() <= _APPROX


def test_more_tail_rows_at_once_than_marked_on_the_event_loop_stay_of_no_known_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    segment = _clustered_segment(monkeypatch, 3000, probes=4, seed=3, folder=None)
    monkeypatch.setattr(dense, "_MARK_MOST", 10)
    _fill(segment, _clustered_rows(11, 24, seed=13), first_seq=10_000)
    _fill(segment, _clustered_rows(10, 24, seed=14), first_seq=11_000)
    assert (segment.cell[3000:3011] == segment.clusters).all()
    assert (segment.cell[3011:3021] > segment.clusters).all()


def test_records_written_again_while_clustering_go_to_the_tail(
    monkeypatch: pytest.MonkeyPatch, folder: Path | None
) -> None:
    monkeypatch.setattr(dense, "CLUSTER_FROM", 1000)
    segment = _Segment(24, folder)
    vectors = _clustered_rows(2000, 24, seed=6)
    _fill(segment, vectors, first_seq=1)
    segment.start_clustering()
    # record 7 changes while the thread runs: dropped, then its new row appended
    segment.drop(np.array([7]))
    moved = -vectors[6]
    _fill(segment, moved[None, :], first_seq=7)
    job = segment._clustering
    assert job is not None
    job.thread.join(60)
    segment.settle()
    at = segment.find(np.array([7 * dense.MAX_PASSAGES]))
    assert segment.centroids is not None and len(at) == 1
    # in the tail, marked at the install with its nearest cluster of the new clustering
    nearest = int(np.argmax(segment.centroids @ moved))
    assert segment.cell[at[0]] == segment.clusters + 1 + nearest
    assert at[0] >= segment.starts[segment.clusters]
    assert np.allclose(segment.cosines(moved)[at[0]], 1.0, atol=0.02)
    assert segment.size == 2000 and (segment.rowid[: segment.size] >= 0).all()


def test_a_large_segment_keeps_its_codes_in_an_unnamed_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Past ``CLUSTER_FROM`` rows the codes leave the process's memory for a file that
    has no name in the folder; rows read back, drop, grow and compact as in memory."""
    monkeypatch.setattr(dense, "CLUSTER_FROM", 1000)
    segment = _Segment(24, tmp_path)
    vectors = _clustered_rows(3000, 24, seed=7)
    _fill(segment, vectors[:900], first_seq=1)
    assert not segment.codes.in_file and segment.codes.nbytes >= 900 * 24
    _fill(segment, vectors[900:], first_seq=901)
    assert segment.codes.in_file and segment.codes.nbytes == 0
    assert segment.codes.file_bytes >= 3000 * 24 and list(tmp_path.iterdir()) == []
    assert np.allclose(segment.cosines(vectors[2500])[2500], 1.0, atol=0.02)
    segment.drop(np.arange(1, 1101, dtype=np.int64))  # over a third: compacted into a new file
    assert segment.size == 1900 and segment.dead == 0 and segment.codes.in_file
    at = segment.find(np.array([2500 * dense.MAX_PASSAGES]))
    assert len(at) == 1 and np.allclose(segment.cosines(vectors[2499])[at[0]], 1.0, atol=0.02)


def test_codes_stay_in_memory_where_a_file_cannot_be_mapped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A folder whose files cannot be mapped (some network mounts), or a platform
    without positional writes, keeps a large segment's codes in memory."""
    monkeypatch.setattr(dense, "CLUSTER_FROM", 100)

    def unmappable(*args: object, **kwargs: object) -> None:
        raise OSError(19, "No such device")

    monkeypatch.setattr(dense.mmap, "mmap", unmappable)
    segment = _Segment(24, tmp_path)
    vectors = _clustered_rows(300, 24, seed=8)
    _fill(segment, vectors, first_seq=1)
    assert not segment.codes.in_file and segment.codes.nbytes >= 300 * 24
    assert np.allclose(segment.cosines(vectors[200])[200], 1.0, atol=0.02)
    monkeypatch.undo()
    monkeypatch.setattr(dense, "CLUSTER_FROM", 100)
    monkeypatch.setattr(dense, "_FILES_WORK", False)
    segment = _Segment(24, tmp_path)
    _fill(segment, vectors, first_seq=1)
    assert not segment.codes.in_file


@pytest.mark.parametrize("lookups_most", [1024, 0])  # a dict of the tail, or np.isin
def test_find_follows_the_rows_appended_since_the_sort(
    monkeypatch: pytest.MonkeyPatch, lookups_most: int
) -> None:
    monkeypatch.setattr(dense, "_LOOKUPS_MOST", lookups_most)
    segment = _Segment(8)
    segment.append(*_rows([64, 65, 128]))
    assert len(segment.find(np.array([64]))) == 1  # sorted: the tail starts empty
    segment.append(*_rows([192, 256]))
    assert sorted(segment.rowid[segment.find(np.array([192, 65, 7]))].tolist()) == [65, 192]
    segment.drop(np.array([3]))  # rowid 192, in the tail
    assert segment.find(np.array([192])).tolist() == []
    segment.append(*_rows([193, 192]))  # written again, further on
    found = segment.find(np.array([192, 193, 256]))
    assert sorted(segment.rowid[found].tolist()) == [192, 193, 256]
    assert (found >= 5).sum() == 2  # the new rows of 192 and 193, not the dropped one


def test_rows_merged_into_the_sort_are_found_as_a_full_sort_finds_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Records appended, dropped and written again over many merges of the rows
    appended since the sort (``_merge_since``): ``find`` gives every live row of the
    rowids asked and no dropped one, as a segment sorted afresh does."""
    monkeypatch.setattr(dense, "_UNSORTED_MOST", 5)
    rng = np.random.default_rng(3)
    segment = _Segment(8)
    live: set[int] = set()
    for step in range(60):
        seqs = rng.choice(40, size=int(rng.integers(1, 6)), replace=False)
        if step % 3 == 2:
            segment.drop(seqs)
            live -= {int(q) * dense.MAX_PASSAGES + p for q in seqs for p in range(2)}
        else:
            segment.drop(seqs)  # written again: its old rows go first
            rowids = [int(q) * dense.MAX_PASSAGES + p for q in seqs for p in range(2)]
            segment.append(*_rows(rowids))
            live -= {
                r // dense.MAX_PASSAGES * dense.MAX_PASSAGES + p for r in rowids for p in (0, 1)
            }
            live |= set(rowids)
        if step % 7 == 0:
            continue  # let appends pile up past the limit before the next find
        asked = np.asarray(sorted({*live, 1, 7 * dense.MAX_PASSAGES + 5}), np.int64)
        found = segment.find(asked)
        assert sorted(segment.rowid[found].tolist()) == sorted(live), step
        assert len(found) == len(set(found.tolist()))
    assert segment._sorted > 0  # merged, not only looked up among the appended rows
    fresh = _Segment(8)
    live_rows = np.flatnonzero(segment.rowid[: segment.size] >= 0)
    fresh.append(*_rows(segment.rowid[live_rows].tolist()))
    asked = np.asarray(sorted(live), np.int64)
    assert sorted(fresh.rowid[fresh.find(asked)].tolist()) == sorted(
        segment.rowid[segment.find(asked)].tolist()
    )


def test_rows_a_filter_drops_take_no_exact_slot() -> None:
    """Rows of another kind nearest the query would fill the EXACT_TOP rescored rows: the
    rows a ranking keeps get them, so its best rows have their exact cosines."""
    rng = np.random.default_rng(0)
    dim, n, other = 384, 5000, 1100
    base = rng.normal(size=dim).astype(np.float32)
    base /= np.linalg.norm(base)
    rows = rng.normal(size=(n, dim)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    rows[:other] = base + 0.05 * rows[:other]  # of the kind left out, nearest the query
    rows[other : other + 2000] = base + 0.35 * rows[other : other + 2000]
    kinds = np.zeros(n, np.int16)
    kinds[:other] = 1
    index = dense.DenseIndex("vec_1", "e", dim)
    segment = _Segment(dim)
    segment.append(
        np.arange(n, dtype=np.int64) * dense.MAX_PASSAGES, np.zeros(n, np.int16), kinds, rows
    )
    index._segments["s"] = segment
    index._codes = {"facts": 0, "A": 0, "B": 1}
    rowids, sims, _ = index.rank(base, ["s"], ["facts"], ["A"], exact=True)
    assert len(rowids) == n - other
    truth = _true_cosines(segment, base, rowids // dense.MAX_PASSAGES)
    best = np.argsort(-sims)[:20]
    assert np.allclose(sims[best], truth[best], rtol=0, atol=1e-6)
    assert set(best.tolist()) == set(np.argsort(-truth)[:20].tolist())


def test_vectors_of_gives_rows_by_rowid_from_every_scope() -> None:
    """Rows asked for come back in rowid order with their vectors, whichever scope holds
    them and in whatever order they were written (a tail after the sort, a second scope)."""
    rng = np.random.default_rng(3)
    index = dense.DenseIndex("vec_1", "e", 8)
    vectors = rng.normal(size=(6, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    first, second = _Segment(8), _Segment(8)
    first.append(np.array([64, 320]), np.zeros(2, np.int16), np.zeros(2, np.int16), vectors[:2])
    assert len(first.find(np.array([64]))) == 1  # sorted: what follows is its tail
    first.append(np.array([256, 128]), np.zeros(2, np.int16), np.zeros(2, np.int16), vectors[2:4])
    second.append(np.array([192, 0]), np.zeros(2, np.int16), np.zeros(2, np.int16), vectors[4:])
    index._segments.update(a=first, b=second)
    expected = {64: vectors[0], 320: vectors[1], 256: vectors[2], 128: vectors[3], 192: vectors[4]}
    for asked in ([320, 256, 128, 64], [64, 128, 192, 256, 320, 999], [256]):
        rowids, rows = index.vectors_of(asked)
        held = sorted(r for r in asked if r in expected)
        assert rowids.tolist() == held
        assert np.allclose(rows, [expected[r] for r in held], atol=0.01)
    rowids, rows = index.vectors_of([])
    assert rowids.tolist() == [] and rows.shape == (0, 8)


@pytest.mark.parametrize("mapped", [True, False])
def test_a_kept_copy_scores_grows_and_is_kept_again_as_the_segment_it_was_kept_from(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mapped: bool
) -> None:
    """A kept copy's code file is mapped as the first rows of the segment taken from it
    (copied into memory where files cannot be mapped), rows written since go after
    them, and every read across the two answers as the segment that was kept does;
    the file is never written."""
    own = tmp_path / "own"
    own.mkdir()
    segment = _clustered_segment(monkeypatch, 3000, probes=4, seed=9, folder=own)
    _fill(segment, _clustered_rows(60, 24, seed=10), first_seq=5000)  # a tail in the copy
    segment.drop(np.array([3, 5001]))  # and dropped rows
    size = segment.size
    arrays = {name: getattr(segment, name)[:size].copy() for name in dense._KEPT_ARRAYS}
    assert segment.centroids is not None
    arrays["centroids"] = segment.centroids.copy()
    path = tmp_path / "kept" / "vec-scope"
    dense._write_kept(path, {"size": size}, arrays, segment.codes, size)
    with np.load(path.with_name(path.name + ".npz")) as data:
        meta = json.loads(str(data["meta"]))
    kept = path.with_name(path.name + ".codes").read_bytes()
    if not mapped:
        monkeypatch.setattr(dense, "_FILES_WORK", False)
    twin = dense._read_kept(path, meta, arrays, np.zeros(1, np.int16), 24, own)
    assert twin is not None and twin.size == size and twin.dead == 2
    # the tail's rows keep their nearest clusters, which the twin's probes read
    assert (twin.cell[3000:size] > segment.clusters).all()
    assert twin.cell[:size].tolist() == segment.cell[:size].tolist()
    assert twin.codes.base_rows == (size if mapped else 0)
    assert twin.codes.nbytes == (0 if mapped else size * 24)

    more = _clustered_rows(40, 24, seed=11)
    for held in (segment, twin):
        _fill(held, more, first_seq=6000)  # after the copy's rows: past the cut
        held.drop(np.array([7, 6001]))  # one row of the copy, one written since
    if mapped:  # grown in place: the same rows at the same positions
        assert twin.size == segment.size == size + 40 and twin.dead == segment.dead == 4
    wanted = segment.rowid[1 : segment.size : 7]  # on both sides of the cut
    for query in [*_clustered_rows(6, 24, seed=12), more[5]]:
        probed, probed_twin = segment.probe(query), twin.probe(query)
        assert probed is not None and probed_twin is not None
        _same(_by_rowid(segment, *probed[:2]), _by_rowid(twin, *probed_twin[:2]))
        every, every_twin = (np.arange(s.size, dtype=np.int64) for s in (segment, twin))
        _same(  # past the EXACT_TOP rescored, rows tied in the first pass may swap
            _by_rowid(segment, every, segment.cosines(query)),
            _by_rowid(twin, every_twin, twin.cosines(query)),
            atol=_APPROX,
        )
        at, at_twin = np.sort(segment.find(wanted)), np.sort(twin.find(wanted))
        assert np.allclose(
            segment.cosines_at(query, at), twin.cosines_at(query, at_twin), atol=1e-6
        )
    assert np.array_equal(segment.vectors(at), twin.vectors(at_twin))
    best = twin.probe(more[5])
    assert best is not None
    assert int(twin.rowid[best[0][int(np.argmax(best[1]))]]) == 6005 * dense.MAX_PASSAGES

    if mapped:  # kept again from the twin: the same rows; it still maps the file it took
        again = tmp_path / "kept" / "vec-again"
        dense._write_kept(again, {"size": twin.size}, {}, twin.codes, twin.size)
        dense._write_kept(path, {"size": segment.size}, {}, segment.codes, segment.size)
        assert (
            again.with_name("vec-again.codes").read_bytes()
            == path.with_name("vec-scope.codes").read_bytes()
        )
        assert twin.codes.base_rows == size
        with twin.codes.rows() as rows:
            assert rows.take(np.arange(size, dtype=np.int64)).tobytes() == kept
    twin.start_clustering()  # a new clustering writes the rows into a file of the process's
    assert twin._clustering is not None
    twin._clustering.thread.join(60)
    assert twin.settle() is False
    assert twin.codes.base_rows == 0 and twin.codes.in_file == mapped
    query = more[5]
    assert np.allclose(
        segment.cosines(query)[segment.find(np.array([6005 * dense.MAX_PASSAGES]))],
        twin.cosines(query)[twin.find(np.array([6005 * dense.MAX_PASSAGES]))],
        atol=1e-6,
    )


def _by_rowid(segment: _Segment, positions: np.ndarray, sims: np.ndarray) -> dict[int, float]:
    """The cosines of the live rows among ``positions``, by rowid."""
    live = segment.rowid[positions] >= 0
    return dict(zip(segment.rowid[positions][live].tolist(), sims[live].tolist(), strict=True))


def _same(cosines: dict[int, float], others: dict[int, float], atol: float = 1e-6) -> None:
    assert cosines.keys() == others.keys()
    assert np.allclose([cosines[r] for r in cosines], [others[r] for r in cosines], atol=atol)
