"""An in-process copy of a vec0 table, so that a k-nearest search reads no vector table.

sqlite-vec's vec0 answers a k-nearest query by reading every vector of the
partition through SQLite: 130-160 ms over the 108,643 passage vectors of a
50,000-memory project on two cores. This index keeps the vectors of each scope
it has been asked about in memory, as int8 codes with one scale per row (388
bytes a passage instead of 1,536; the cosine moves by about 1e-4 at 384
dimensions), and scores a scope with numpy in blocks of 1,024 rows.

vec0 stays the store of record, and the only one written. A scope's rows are
read from vec0's chunk tables the first time a search names it (0.6 s at
50,000 memories, 2-2.4 s at 200,000, where a scan of the vec0 table takes 4.7 s at
50,000); the store checks
that it reads them right against vec0 itself, and answers through vec0 as
before when it does not (another sqlite-vec layout, a corrupt chunk).

The ``vector_changes`` log keeps the copy current across processes: every
write or delete of a record's vectors adds the record's ``seq`` to it, in the
same transaction. Before each search the index applies the entries it has not
seen; an entry means "drop what you hold of this record, then read what it has
now", so applying one twice, or after a load that already saw the change, does
no harm. An index that has fallen far behind (the log is pruned to its last
50,000 entries) starts again from the chunk tables.

A scope of ``CLUSTER_FROM`` rows or more is clustered (spherical k-means,
``storage.base.ivf_lists`` clusters, in a background thread) and its rows ordered by
cluster, so that a search scores the rows of the ``IVF_PROBES`` clusters nearest to
the query, plus the rows written since (the tail), instead of every row: 1.9 ms
instead of 29 ms over the 435,806 rows of a 200,000-memory project, with 0.99
of the exact top 50 records (``bench perf`` prints the recall it measures). A
search whose filters leave fewer than it asked for among those rows scores
every row. The clusters are made again once the tail holds a fiftieth of the
rows (``_TAIL_SHARE``); until the first clustering lands, searches score every row.

A clustered scope is kept for the next process (``DenseIndex._keep_landed``, in
``<database>-vectors/`` beside the database): its code rows and arrays, written in
a thread once a clustering lands, tied to the log entry it was current at. The
next process takes it instead of reading vec0's chunks and clustering again (0.2 s
instead of 2-2.4 s and 4.6 s of clustering at 200,000 memories), re-reading the
records the log names since; it trusts it only if the entry is still in the log,
unchanged, the code rows' checksum holds, and afterwards it holds as many rows as
the records say and three of them match vec0's own (``_from_kept``). The code rows
are mapped from the kept file as they are (``_Codes``'s base), not copied: every
process that takes the same copy shares its pages.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import mmap
import os
import sqlite3
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import (
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import anyio
import numpy as np
import numpy.typing as npt

from memory_mcp.overlap import alongside
from memory_mcp.passages import MAX_PASSAGES
from memory_mcp.storage.base import IVF_PROBES, Vector, ivf_lists

if TYPE_CHECKING:
    from memory_mcp.storage.sqlite.vectors import Written

log = logging.getLogger(__name__)

Fetch = Callable[[str, Sequence[Any]], Awaitable[list[Any]]]
"""Runs a read query (on the store's reader connection) and returns its rows."""

_UNSORTED_MOST = 4096  # rows appended since ``find`` sorted the rowids, before it sorts again
_LOOKUPS_MOST = 1024  # rowids ``find`` looks up one by one among those rows; more: ``np.isin``
BLOCK = 1024  # rows scored at a time: the float32 copy of a block stays in cache
# An exact search scores every row of a segment in place, unless at most three
# quarters of them pass its filters: then those rows only, gathered a block at a time
# (a row gathered costs about 1.4x a row in place: 45 vs 33 ns at 50,000 memories).
_GATHER_SHARE = 0.75
_GATHER_BLOCK = 512
# A ranking's best rows whose cosines are computed exactly (``_Segment._score``), a
# block at a time: a float32 block stays under the 256 KB from which an allocation is
# a fresh mapping, faulted in page by page (``embedders.fastembed._return_large_buffers``).
EXACT_TOP = 512
_EXACT_BLOCK = 128
# Rows quantized at a time: a load's chunk of about 1,000 rows at once made float32
# temporaries of 1.5 MB, each a fresh mapping faulted in page by page: 1.26 s of the
# 3 s that loading 435,000 rows took, 0.5 s a block at a time.
_QUANTIZE_BLOCK = 128
KEEP_CHANGES = 50_000  # log entries kept; a reader further behind reloads
_RELOAD_AFTER = 20_000  # changes to catch up on beyond which a reload is cheaper
_SUPPORTED_LAYOUT = ("0", "1")  # sqlite-vec major, minor of the chunk tables read here


_LOAD_ATTEMPTS = 3  # loads that writes of other connections may spoil in a row
_KEPT_FORMAT = 1  # of a kept copy's files (``_write_kept``): another number ignores them
_KEPT_ARRAYS = ("scale", "rowid", "corpus", "kind", "cell")
# Records changed since a kept copy beyond which the process that takes it keeps it
# again at once: 5,852 of them took 0.66 s to read again at 200,000 memories.
_KEEP_AGAIN_AFTER = 1000
# Log entries since a scope's copy was kept (or taken) beyond which the process keeps it
# again (``_keep_landed``): a process that changes many records (a consolidation sweep
# folded about 15,000 at 200,000 memories) could leave the next one a copy more than
# ``_RELOAD_AFTER`` records behind, which it loads from the chunks and clusters
# instead, or thousands of records to read into it: after 2,500 stores at 200,000,
# the next server's first search came 1.03 s after launch, 0.86 with this.
_KEEP_EVERY = 5000
# The records whose rows a scope's copy holds (parameters: the scope, the embedder),
# read from ``records_embedder`` alone (its columns since m014), never the table.
HELD = "scope_key = ? AND embedder = ? AND live = 1 AND vec_rows > 0"

CLUSTER_FROM = 20_000  # rows of a scope from which its searches probe clusters
PROBE_ROWS = 256  # rows a probe scores at least, on average (``probed_clusters``)
# Rows written since the clustering (the tail), as a share of the rows, that start
# another. A kept copy carries its tail to the next process: at a tenth, the 200,000
# store's copy held a tail of 19,503 rows, and a search there (which scored every
# tail row then; now those of the clusters it probes) took 1.8-2.5 ms more over the
# model than once clustered again.
_TAIL_SHARE = 0.02
_SAMPLE_PER_CLUSTER = 48  # rows k-means trains on, per cluster
_ROUNDS = 8  # k-means rounds
# Rows per matrix product of a clustering: 0.1-0.2 s here at 200,000 memories, the
# longest a stopped clustering runs on (``_Clustering``).
_CLUSTER_BLOCK = 8 * BLOCK


class LayoutError(Exception):
    """vec0's chunk tables are not laid out the way this index reads them."""


class Moved(Exception):
    """A scope changed while it loaded; its searches go through vec0 this once."""


def probed_clusters(probes: int, rows: int, clusters: int) -> int:
    """How many of a segment's ``clusters`` (holding ``rows``) a search asking for
    ``probes`` scores: more where the clusters are small, so that it scores at least
    ``PROBE_ROWS`` rows a probe on average.

    A scope's clusters hold about ``sqrt(rows) / 1.55`` rows (``ivf_lists``): 270 at
    50,000 memories, but 96 at 10,000 (22,346 rows, 232 clusters), where 48 probes
    found 0.977 of the exact top 50 records and the write path's 24 found 0.933.
    """
    wanted = math.ceil(probes * PROBE_ROWS * clusters / rows) if rows > 0 else probes
    return min(clusters, max(probes, wanted))


def _quantize(vectors: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.int8], Vector]:
    """int8 codes and scales with ``codes * scale`` the unit vector of each row."""
    norms = np.linalg.norm(vectors, axis=1)
    peak = np.abs(vectors).max(axis=1)
    ok = (norms > 0) & (peak > 0)
    step = np.where(ok, peak / 127.0, 1.0).astype(np.float32)
    codes = np.round(vectors / step[:, None]).astype(np.int8)
    scale = np.where(ok, step / np.where(ok, norms, 1.0), 0.0).astype(np.float32)
    return codes, scale


# positional writes and read-only mappings (not on Windows: codes stay in memory there)
_FILES_WORK = hasattr(os, "pwrite") and hasattr(mmap, "PROT_READ")


class _Rows:
    """A segment's code rows while they are mapped (``_Codes.rows``): one array, or a
    kept copy's rows followed by those written since (two arrays, ``cut`` the first
    row of the second). Views of them must not outlive the ``rows`` block."""

    def __init__(self, parts: Sequence[npt.NDArray[np.int8]]) -> None:
        self.parts = parts
        self.cut = len(parts[0])

    def span(self, first: int, last: int) -> Iterator[tuple[int, npt.NDArray[np.int8]]]:
        """Rows ``first`` to ``last`` as views, with the position of each view's first row
        (two views if they run across ``cut``)."""
        if len(self.parts) == 1 or last <= self.cut:
            yield first, self.parts[0][first:last]
            return
        if first < self.cut:
            yield first, self.parts[0][first:]
        start = max(first, self.cut)
        yield start, self.parts[1][start - self.cut : last - self.cut]

    def take(self, positions: npt.NDArray[np.int64]) -> npt.NDArray[np.int8]:
        """A copy of the rows at ``positions``."""
        head = self.parts[0]
        if len(self.parts) == 1 or not len(positions):
            rows: npt.NDArray[np.int8] = head[positions]
            return rows
        tail = self.parts[1]
        low = positions < self.cut
        if low.all():
            rows = head[positions]
        elif not low.any():
            rows = tail[positions - self.cut]
        else:
            rows = np.empty((len(positions), head.shape[1]), np.int8)
            rows[low] = head[positions[low]]
            rows[~low] = tail[positions[~low] - self.cut]
        return rows


class _Codes:
    """A segment's int8 rows: in an array, or in a file once the segment is large.

    A file (unnamed, beside the database, gone when the process ends) keeps the
    rows in the system's page cache instead of this process's memory: 167 MB of
    rows at 200,000 memories. Its rows are read through a mapping made for each
    read and closed after it, so only the pages of the clusters a search scores
    are mapped, and only while it scores them; they are written with ``pwrite``.
    A row is never written again once the segment holds it (a rebuild writes a
    new file), so a clustering thread may read a file while searches append.

    ``base``: a kept copy's code file (``_read_kept``), opened read-only, whose rows
    are the first ``base_rows`` of these: mapped as they are instead of copied (176
    MB at 200,000 memories, 0.5-0.6 s a start), and shared in the page cache with
    every process that took the same copy. Its file is never written (a copy kept
    again is a new file renamed into place), so it stays as it was while open.
    """

    def __init__(
        self,
        dim: int,
        capacity: int,
        folder: Path | None = None,
        base: IO[bytes] | None = None,
        base_rows: int = 0,
    ) -> None:
        self.dim = dim
        self.capacity = capacity
        self._base = base
        self.base_rows = base_rows if base is not None else 0
        self._ram: npt.NDArray[np.int8] | None = None
        self._file: IO[bytes] | None = None
        own = capacity - self.base_rows
        if folder is not None and not _FILES_WORK:
            folder = None
        if folder is not None:
            try:
                # closed when the last _Codes that shares it goes
                self._file = tempfile.TemporaryFile(dir=folder, prefix="memory-mcp-vectors-")  # noqa: SIM115
                os.ftruncate(self._file.fileno(), max(1, own * dim))
                # a folder whose files cannot be mapped (some network mounts) fails here
                mmap.mmap(self._file.fileno(), 1, prot=mmap.PROT_READ).close()
            except (OSError, ValueError) as exc:  # read-only, full, unmappable: in memory
                log.warning("vectors held in memory, not in a file in %s: %s", folder, exc)
                self._file = None
        if self._file is None:
            self._ram = np.zeros((own, dim), np.int8)

    @property
    def in_file(self) -> bool:
        return self._file is not None

    @property
    def nbytes(self) -> int:
        """The bytes this process holds (a file's are the page cache's)."""
        return 0 if self._ram is None else self._ram.nbytes

    @property
    def file_bytes(self) -> int:
        own = 0 if self._file is None else (self.capacity - self.base_rows) * self.dim
        return own + self.base_rows * self.dim

    @contextlib.contextmanager
    def rows(self) -> Iterator[_Rows]:
        """Every row (``capacity`` of them), for this block of code only: views of them
        must not outlive it."""
        with contextlib.ExitStack() as maps:
            parts: list[npt.NDArray[np.int8]] = []
            if self._base is not None:
                parts.append(self._mapped(maps, self._base, self.base_rows))
            if self._ram is not None:
                parts.append(self._ram)
            else:
                assert self._file is not None
                parts.append(self._mapped(maps, self._file, self.capacity - self.base_rows))
            if len(parts) == 2 and not len(parts[1]):
                parts.pop()
            yield _Rows(parts)

    def _mapped(
        self, maps: contextlib.ExitStack, file: IO[bytes], rows: int
    ) -> npt.NDArray[np.int8]:
        if not rows:
            return np.zeros((0, self.dim), np.int8)
        mapped = mmap.mmap(file.fileno(), rows * self.dim, prot=mmap.PROT_READ)

        def close() -> None:
            with contextlib.suppress(BufferError):  # else it closes with the last view
                mapped.close()

        maps.callback(close)
        return np.frombuffer(mapped, np.int8).reshape(rows, self.dim)

    def take(self, positions: npt.NDArray[np.int64]) -> npt.NDArray[np.int8]:
        """A copy of these rows."""
        with self.rows() as every:
            return every.take(positions)

    def write(self, start: int, rows: npt.NDArray[np.int8]) -> None:
        """Rows ``start`` on (which nothing has read yet; not the base's)."""
        start -= self.base_rows
        assert start >= 0
        if self._ram is not None:
            self._ram[start : start + len(rows)] = rows
        else:
            assert self._file is not None
            os.pwrite(self._file.fileno(), np.ascontiguousarray(rows).tobytes(), start * self.dim)

    def grown(self, capacity: int) -> _Codes:
        """The same rows with room for ``capacity`` (this object stays as it was for
        whoever reads it still)."""
        if self._file is None:
            return self.rebuilt(np.arange(self.capacity, dtype=np.int64), capacity, None)
        os.ftruncate(self._file.fileno(), (capacity - self.base_rows) * self.dim)
        twin = copy.copy(self)  # the same files
        twin.capacity = capacity
        return twin

    def rebuilt(self, order: npt.NDArray[np.int64], capacity: int, folder: Path | None) -> _Codes:
        """Rows ``order`` of these, in that order, with room for ``capacity``: in a file
        in ``folder`` if one is given."""
        new = _Codes(self.dim, capacity, folder)
        with self.rows() as old:
            for start in range(0, len(order), 16 * BLOCK):
                new.write(start, old.take(order[start : start + 16 * BLOCK]))
        return new


class _Segment:
    """The rows of one scope, in arrays that grow by half again when full."""

    def __init__(self, dim: int, folder: Path | None = None) -> None:
        self.dim = dim
        self.folder = folder  # where the codes go once the segment is large (None: memory)
        self.size = 0
        self.dead = 0
        self.codes = _Codes(dim, 0)
        self.scale = np.zeros(0, np.float32)
        self.rowid = np.zeros(0, np.int64)  # -1: a dropped row
        self.corpus = np.zeros(0, np.int16)
        self.kind = np.zeros(0, np.int16)
        # Clusters: each row's cluster, rows ordered by it up to the tail (the rows
        # written since the clustering), whose rows hold ``len(centroids) + 1 + c``
        # for their nearest cluster ``c`` (``append``), or ``len(centroids)`` where
        # none is known (rows the clustering did not see, or kept before this was):
        # a search scores the tail rows of the clusters it probes, and those.
        self.cell = np.zeros(0, np.int32)
        self.centroids: npt.NDArray[np.float32] | None = None
        self._starts: npt.NDArray[np.int64] | None = None
        self._clustering: _Clustering | None = None
        self.landed = False  # a clustering was installed since the copy was last kept
        self.kept_at: int | None = None  # the log position of the copy kept or taken
        # Rows by rowid (positions, and their rowids in ascending order) for the
        # first ``_sorted`` rows, for ``find``; made again when rows move.
        self._by_rowid: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None
        self._sorted = 0
        # The rows appended since the sort, by rowid, up to position ``_since_upto``.
        self._since: dict[int, int] = {}
        self._since_upto = 0

    def find(self, rowids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The positions of the rows with these rowids that the segment holds.

        A binary search in the rows sorted by rowid, and a look-up among the rows
        appended since the sort (``_find_since``): sorting 110,000 rowids again
        after every write cost a store 4 ms, and a membership test over every row
        3-28 ms per call.
        """
        order, keys = self.sort_rowids()
        if not len(rowids):
            return np.zeros(0, np.int64)
        found: list[npt.NDArray[np.int64]] = []
        if len(keys):
            at = np.searchsorted(keys, rowids)
            inside = at < len(keys)
            at, wanted = at[inside], rowids[inside]
            found.append(order[at[keys[at] == wanted]])
        if self.size > self._sorted:
            found.append(self._find_since(rowids))
        positions = np.concatenate(found) if found else np.zeros(0, np.int64)
        # rows dropped since the sort hold -1 now; wanted rowids are >= 0
        kept: npt.NDArray[np.int64] = positions[self.rowid[positions] >= 0]
        return kept

    def sort_rowids(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The rows by rowid for ``find`` (positions, and their rowids ascending), sorted
        once more rows than ``_UNSORTED_MOST`` came after the sort.

        The first sort of a loaded copy (469,000 rows at 200,000 memories) takes 25 ms:
        a load does it (``DenseIndex.load``), not the first search. Later, the rows
        appended since are merged in (``_merge_since``) rather than every row sorted
        again.
        """
        if self._by_rowid is None:
            order = np.argsort(self.rowid[: self.size], kind="stable")
            self._by_rowid = (order, self.rowid[: self.size][order])
        elif self.size - self._sorted > _UNSORTED_MOST:
            self._by_rowid = self._merge_since(*self._by_rowid)
        else:
            return self._by_rowid
        self._sorted = self.size
        self._since, self._since_upto = {}, self.size
        return self._by_rowid

    def _merge_since(
        self, order: npt.NDArray[np.int64], keys: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``order`` and ``keys`` without the rows dropped since the sort, with the live
        rows appended since it in their places: linear in the rows, where a sort of
        them all took 25 ms at 469,000 rows."""
        kept = self.rowid[order] == keys  # a dropped row holds -1 now
        order, keys = order[kept], keys[kept]
        fresh = np.arange(self._sorted, self.size, dtype=np.int64)
        fresh = fresh[np.argsort(self.rowid[fresh], kind="stable")]
        at = np.searchsorted(keys, self.rowid[fresh])
        return np.insert(order, at, fresh), np.insert(keys, at, self.rowid[fresh])

    def _find_since(self, rowids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The positions of these rowids among the rows appended since the sort: by a
        dict of them for a few rowids (a record's: 0.01 ms), a membership test for many."""
        if len(rowids) > _LOOKUPS_MOST:
            since = np.isin(self.rowid[self._sorted : self.size], rowids)
            return np.flatnonzero(since) + self._sorted
        if self._since_upto < self.size:
            fresh = self.rowid[self._since_upto : self.size].tolist()
            self._since.update(zip(fresh, range(self._since_upto, self.size), strict=True))
            self._since_upto = self.size
        at = [self._since.get(r, -1) for r in rowids.tolist()]
        return np.asarray([p for p in at if p >= 0], np.int64)

    def append(
        self,
        rowids: npt.NDArray[np.int64],
        corpus: npt.NDArray[np.int16],
        kind: npt.NDArray[np.int16],
        vectors: npt.NDArray[np.float32],
    ) -> None:
        count = len(rowids)
        if not count:
            return
        need = self.size + count
        if need > len(self.rowid):
            self._grow(max(need, len(self.rowid) * 3 // 2, 64))
        end = self.size + count
        codes = np.empty((count, self.dim), np.int8)
        for start in range(0, count, _QUANTIZE_BLOCK):  # temporaries that stay in the heap
            stop = min(count, start + _QUANTIZE_BLOCK)
            codes[start:stop], self.scale[self.size + start : self.size + stop] = _quantize(
                vectors[start:stop]
            )
        self.codes.write(self.size, codes)
        self.rowid[self.size : end] = rowids
        self.corpus[self.size : end] = corpus
        self.kind[self.size : end] = kind
        self.cell[self.size : end] = self.clusters
        # in the tail, each row marked with its nearest cluster (``_MARK_MOST``)
        if self.centroids is not None and count <= _MARK_MOST:
            self.cell[self.size : end] += 1 + _nearest_cells(self.centroids, vectors)
        self.size = end

    def _grow(self, capacity: int) -> None:
        """Room for ``capacity`` rows. Codes in a file grow in place, dropped rows and all
        (``drop`` compacts them once they are many): a large segment's rows are not
        written again to add one, and a kept copy's stay mapped."""
        if not (self.codes.in_file or self.codes.base_rows):
            self._resize(capacity)
            return
        self.codes = self.codes.grown(capacity)
        for name in ("scale", "rowid", "corpus", "kind", "cell"):
            old = getattr(self, name)
            new = np.zeros((capacity, *old.shape[1:]), old.dtype)
            new[: self.size] = old[: self.size]
            setattr(self, name, new)

    def _resize(self, capacity: int) -> None:
        """Keep the live rows only, in arrays of ``capacity`` rows."""
        live = np.flatnonzero(self.rowid[: self.size] >= 0)
        capacity = max(capacity, len(live))
        self._rebuild(live, capacity)

    def _rebuild(self, order: npt.NDArray[np.int64], capacity: int) -> None:
        """Keep rows ``order`` (positions), in that order, in arrays of ``capacity`` rows."""
        folder = self.folder if capacity >= CLUSTER_FROM else None
        # every row kept, in place: the file stays (no row of it is written again)
        grows = (
            capacity >= self.codes.capacity
            and len(order) == self.size
            and np.array_equal(order, np.arange(self.size))
        )
        if grows and folder is not None and self.codes.in_file:
            self.codes = self.codes.grown(capacity)
        else:
            self.codes = self.codes.rebuilt(order, capacity, folder)
        for name in ("scale", "rowid", "corpus", "kind", "cell"):
            old = getattr(self, name)
            new = np.zeros((capacity, *old.shape[1:]), old.dtype)
            new[: len(order)] = old[order]
            setattr(self, name, new)
        self.size, self.dead = len(order), 0
        self._by_rowid = None
        self._starts = None

    def drop(self, seqs: npt.NDArray[np.int64]) -> None:
        """Forget the rows of these records."""
        owned = (seqs[:, None] * MAX_PASSAGES + np.arange(MAX_PASSAGES)).reshape(-1)
        gone = self.find(owned)
        hits = len(gone)
        if hits:
            if self._clustering is not None:
                self._clustering.dropped.append(seqs.copy())
            self.rowid[gone] = -1
            self.dead += hits
            if self.dead > max(BLOCK, self.size // 4):
                self._resize(self.size - self.dead)

    def passing(
        self,
        corpus_ok: npt.NDArray[np.bool_],
        kind_ok: npt.NDArray[np.bool_] | None,
        at: npt.NDArray[np.int64] | slice,
    ) -> npt.NDArray[np.bool_]:
        """Which of the rows ``at`` are live and of an allowed corpus and kind."""
        keep: npt.NDArray[np.bool_] = (self.rowid[at] >= 0) & corpus_ok[self.corpus[at]]
        if kind_ok is not None:
            keep &= kind_ok[self.kind[at]]
        return keep

    def vectors(self, positions: npt.NDArray[np.int64]) -> Vector:
        """These rows as float32 vectors (from the int8 codes: unit length to about 1%).

        Scaled in place: an array of 256 KB or more is a fresh mapping, faulted in page
        by page (``_EXACT_BLOCK``): a search's neighbours in time, about 350 rows, took
        0.97 ms with four copies of 537 KB (``DenseIndex.vectors_of``), 0.36 ms with one.
        """
        rows: Vector = self.codes.take(positions).astype(np.float32)
        rows *= self.scale[positions][:, None]
        return rows

    def cosines(self, query: Vector, keep: npt.NDArray[np.bool_] | None = None) -> Vector:
        """The cosine of every row with the unit vector ``query`` (dropped rows too): the
        best ``EXACT_TOP`` of those ``keep`` holds exact, the rest to about 1e-3
        (``_score``)."""
        return self._score(query, [(0, self.size)], np.arange(self.size, dtype=np.int64), keep)

    def probe(
        self,
        query: Vector,
        corpus_ok: npt.NDArray[np.bool_] | None = None,
        kind_ok: npt.NDArray[np.bool_] | None = None,
        probes: int | None = None,
    ) -> tuple[npt.NDArray[np.int64], Vector, npt.NDArray[np.bool_]] | None:
        """The positions and cosines of the rows in the ``probes`` (``IVF_PROBES``)
        clusters nearest to ``query``, and of the tail (as ``cosines``), with which of
        them pass (``passing``); None: the segment is not clustered. Without
        ``corpus_ok``, every live row passes."""
        if self.centroids is None:
            return None
        starts = self.starts
        clusters = len(self.centroids)
        probes = probed_clusters(probes or IVF_PROBES, int(starts[clusters]), clusters)
        near = np.arange(clusters)
        if clusters > probes:
            near = np.argpartition(-(self.centroids @ query), probes)[:probes]
        spans = [(int(starts[c]), int(starts[c + 1])) for c in np.sort(near)]
        tail = int(starts[clusters])
        if clusters > probes:  # the tail's rows of those clusters, and of none known
            probed = np.zeros(clusters + 1, np.bool_)
            probed[0] = True
            probed[1 + near] = True
            tail_rows = tail + np.flatnonzero(probed[self.cell[tail : self.size] - clusters])
        else:
            spans.append((tail, self.size))
            tail_rows = np.zeros(0, np.int64)
        spans = [(a, b) for a, b in spans if b > a]
        positions = np.concatenate(
            [np.arange(a, b, dtype=np.int64) for a, b in spans] + [tail_rows.astype(np.int64)]
        )
        if corpus_ok is None:
            keep: npt.NDArray[np.bool_] = self.rowid[positions] >= 0
        else:
            keep = self.passing(corpus_ok, kind_ok, positions)
        return positions, self._score(query, spans, positions, keep), keep

    def cosines_at(self, query: Vector, positions: npt.NDArray[np.int64]) -> Vector:
        """The cosines of the rows at these positions (ascending) with ``query`` (as
        ``cosines``): the rows a filter keeps, gathered a block at a time."""
        return self._score(query, [], positions)

    def _score(
        self,
        query: Vector,
        spans: Sequence[tuple[int, int]],
        positions: npt.NDArray[np.int64],
        keep: npt.NDArray[np.bool_] | None = None,
    ) -> Vector:
        """The cosines of the rows at ``positions`` with the unit vector ``query``, in order.

        ``spans``: the first positions as runs (start, stop); the positions after those (all
        of them without spans) are gathered ``_GATHER_BLOCK`` at a time. Every row is scored
        against an int8 copy of the query (``_int8_query``) with numkong's SIMD kernels,
        then the best ``EXACT_TOP`` again with the float32 query, as all were before: 0.17
        ms for the 9,000 rows of 48 clusters, where a float32 copy of each block for a
        matrix product took 1.3 ms. The first pass is off by about 1e-3 at most, which only
        the order of rows past the best ``EXACT_TOP`` can feel. ``keep``: the rows the
        caller keeps (live, of its corpora and kinds), among which the best are chosen: rows
        it drops then never take an exact slot from one it returns.
        """
        import numkong

        count = len(positions)
        out = np.empty((1, count), np.float32)
        codes8, step = _int8_query(query)
        probe = codes8[None, :]
        with self.codes.rows() as codes:
            at = 0
            for first, last in spans:
                for start, rows in codes.span(first, last):
                    into = out[:, at + start - first : at + start - first + len(rows)]
                    numkong.cdist(probe, rows, "dot", out=into)
                at += last - first
            for start in range(at, count, _GATHER_BLOCK):
                rows = codes.take(positions[start : start + _GATHER_BLOCK])
                numkong.cdist(probe, rows, "dot", out=out[:, start : start + len(rows)])
            sims: Vector = out[0]
            sims *= self.scale[positions] * np.float32(step)
            top = None
            if count > EXACT_TOP:
                ranked = sims if keep is None else np.where(keep, sims, -np.inf)
                top = np.argpartition(-ranked, EXACT_TOP)[:EXACT_TOP]
            best = positions if top is None else positions[top]
            exact = np.empty(len(best), np.float32)
            for start in range(0, len(best), _EXACT_BLOCK):
                chosen = best[start : start + _EXACT_BLOCK]
                rows = codes.take(chosen).astype(np.float32)
                np.matmul(rows, query, out=exact[start : start + len(chosen)])
            exact *= self.scale[best]
            del codes
        if top is None:
            return exact
        sims[top] = exact
        return sims

    # Clusters ----------------------------------------------------------------------

    @property
    def clusters(self) -> int:
        """The number of clusters (0: not clustered), which is also the tail's cell."""
        return 0 if self.centroids is None else len(self.centroids)

    @property
    def starts(self) -> npt.NDArray[np.int64]:
        """Where each cluster's rows start, and (last) where the tail starts."""
        if self._starts is None:
            bounds = np.arange(self.clusters + 1, dtype=np.int32)
            self._starts = np.searchsorted(self.cell[: self.size], bounds).astype(np.int64)
        return self._starts

    @property
    def wants_clusters(self) -> bool:
        """Whether a (new) clustering would pay: many rows, and a long tail if clustered."""
        live = self.size - self.dead
        if live < CLUSTER_FROM or self._clustering is not None:
            return False
        if self.centroids is None:
            return True
        return self.size - int(self.starts[self.clusters]) > _TAIL_SHARE * live

    def start_clustering(self) -> _Clustering:
        """Cluster the rows held now, in a background thread (``settle`` installs it)."""
        live = np.flatnonzero(self.rowid[: self.size] >= 0)
        job = _Clustering(self.codes, live, self.rowid[live].copy())
        self._clustering = job
        job.thread.start()
        return job

    def settle(self) -> bool:
        """Install a finished clustering; True if one is still running."""
        job = self._clustering
        if job is None:
            return False
        if job.thread.is_alive():
            return True
        self._clustering = None
        if job.result is None:  # it failed (logged); a later search tries again
            return False
        centroids, rowids, cells = job.result
        rowid = self.rowid[: self.size]
        order = np.argsort(rowids)
        keys, cells = rowids[order], cells[order]
        at = np.minimum(np.searchsorted(keys, rowid), len(keys) - 1)
        known = (keys[at] == rowid) & (rowid >= 0)
        if job.dropped:  # rows written again since: their clusters may have changed
            known &= ~np.isin(rowid // MAX_PASSAGES, np.concatenate(job.dropped))
        cell = np.where(known, cells[at], len(centroids)).astype(np.int32)
        # the rows written while it ran: marked with their nearest new cluster
        unseen = np.flatnonzero(~known & (rowid >= 0))
        if 0 < len(unseen) <= _MARK_MOST:
            nearest = _nearest_cells(centroids, self.vectors(unseen))
            cell[unseen] = len(centroids) + 1 + nearest
        self.cell[: self.size] = cell
        self.centroids = centroids
        live = np.flatnonzero(rowid >= 0)
        self._rebuild(live[np.argsort(cell[live], kind="stable")], len(self.rowid))
        self.landed = True
        return False

    @property
    def nbytes(self) -> int:
        """The bytes this process holds for the segment (not its file's)."""
        extra = self.codes.nbytes + (0 if self.centroids is None else self.centroids.nbytes)
        arrays = (self.scale, self.rowid, self.corpus, self.kind, self.cell)
        return extra + sum(a.nbytes for a in arrays)


class _Clustering:
    """Spherical k-means over a segment's rows, in a daemon thread (numpy releases the
    GIL in its matrix products, so searches go on meanwhile).

    ``stop`` ends it at its next block of rows. A process must not exit while the
    thread is inside a matrix product: OpenBLAS's exit handler then waits for its
    own threads forever (a ``memory-mcp search`` at 50,000 memories hung at exit
    4 times in 20) or frees buffers still in use (a crash); ``DenseIndex.close``
    stops and joins every clustering before its store closes.
    """

    def __init__(
        self, codes: _Codes, positions: npt.NDArray[np.int64], rowids: npt.NDArray[np.int64]
    ) -> None:
        self._codes: _Codes | None = codes  # rows ``positions`` are never written again
        self._positions = positions
        self.rowids = rowids
        self.dropped: list[npt.NDArray[np.int64]] = []  # records dropped meanwhile
        self.result: tuple[Vector, npt.NDArray[np.int64], npt.NDArray[np.int32]] | None = None
        self._stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="vector-clusters", daemon=True)

    def stop(self) -> None:
        """Ask the thread to end at its next block of rows (it leaves no result)."""
        self._stopping.set()

    def _run(self) -> None:
        try:
            background()
            assert self._codes is not None
            self.result = cluster(self._codes, self._positions, self.rowids, self._stopping)
        except _Stopped:
            pass
        except Exception:
            log.warning("could not cluster the vectors of a scope", exc_info=True)
        finally:
            self._codes = None


BACKGROUND_NICE = 19  # the niceness of the threads that work for later searches


def background() -> None:
    """Let the calling thread yield the cores to the process's others (Linux: it alone
    gets ``BACKGROUND_NICE``; elsewhere, nothing).

    A clustering (4.5 s of a core at 200,000 memories) and a kept copy's write run
    beside the searches and stores they are for: on two cores, searches while a
    clustering ran at 50,000 memories took p50 13.8-17.8 ms, 13.0-13.5 with it
    niced, 9.8-10.7 once it ended (four clusterings each, taking turns); the
    clustering took 6.4-7.1 s instead of 4.3-4.5 while searched. A thread cannot
    lower its niceness again, so only threads that end with their work call this.
    """
    if sys.platform != "linux":  # elsewhere setpriority does not take a thread's id
        return
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)


class _Stopped(Exception):
    """A clustering was stopped before it finished."""


def cluster(
    codes: _Codes,
    positions: npt.NDArray[np.int64],
    rowids: npt.NDArray[np.int64],
    stopping: threading.Event | None = None,
) -> tuple[Vector, npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """Centroids (unit rows) of these rows of ``codes``, and each row's nearest.

    The clusters number ``ivf_lists(rows)``; k-means trains
    on a sample of ``_SAMPLE_PER_CLUSTER`` rows per cluster for ``_ROUNDS`` rounds
    (the cosine ignores the rows' scales, so the codes serve as they are), then
    every row goes to its nearest centroid. Seeded, so that it is repeatable.
    The rows go through ``_nearest_cells`` ``_CLUSTER_BLOCK`` at a time, and
    ``stopping`` is looked at before each block (raises ``_Stopped`` once set).
    """
    rng = np.random.default_rng(len(positions))
    count = len(positions)
    clusters = ivf_lists(count)
    picked = np.sort(rng.choice(count, min(count, clusters * _SAMPLE_PER_CLUSTER), replace=False))
    sample = _units(codes.take(positions[picked]))
    centroids = sample[rng.choice(len(sample), clusters, replace=False)]
    for _ in range(_ROUNDS):
        nearest = _nearest_cells(centroids, sample, stopping)
        sums = np.zeros_like(centroids)
        np.add.at(sums, nearest, sample)
        empty = np.bincount(nearest, minlength=clusters) == 0
        sums[empty] = sample[rng.choice(len(sample), int(empty.sum()))]
        centroids = _units(sums)
    cells = np.empty(count, np.int32)
    for start in range(0, count, _CLUSTER_BLOCK):
        part = codes.take(positions[start : start + _CLUSTER_BLOCK]).astype(np.float32)
        cells[start : start + len(part)] = _nearest_cells(centroids, part, stopping)
    return centroids, rowids, cells


# The most tail rows marked with their nearest clusters at once, on the event loop (an
# append, such as a load's read of the records changed since a kept copy, or the rows
# written during a clustering, at its install): 9,677 rows took 77 ms at 1,088
# clusters. More stay of no known cluster, scored by every search until the next
# clustering.
_MARK_MOST = 10_000
# Rows up to which ``_nearest_cells`` uses numkong's kernels rather than numpy's product
_FEW_ROWS = 8


def _nearest_cells(
    centroids: Vector,
    vectors: npt.NDArray[np.float32],
    stopping: threading.Event | None = None,
) -> npt.NDArray[np.int32]:
    """Each vector's nearest centroid (the centroids unit rows; a vector's length does
    not change which), ``_CLUSTER_BLOCK`` vectors at a time, ``stopping`` looked at
    before each (raises ``_Stopped`` once set: a clustering's).

    A store's few rows go through numkong's SIMD kernels on the calling thread: numpy's
    matrix product there (0.02 ms for one row at 1,088 clusters) woke OpenBLAS's threads,
    which then held the second core the next store's embedding wanted: stores at 200,000
    memories took p50 15.1-16.1 ms instead of 11.9-12.6 (with ``OPENBLAS_NUM_THREADS=1``,
    11.9-13.1). Many rows at once (a copy read into at a load) take the product.
    """
    import numkong

    centroids = np.ascontiguousarray(centroids, np.float32)  # numkong: one dtype on both sides
    cells = np.empty(len(vectors), np.int32)
    for start in range(0, len(vectors), _CLUSTER_BLOCK):
        if stopping is not None and stopping.is_set():
            raise _Stopped
        part = np.ascontiguousarray(vectors[start : start + _CLUSTER_BLOCK], np.float32)
        if len(part) <= _FEW_ROWS:
            scores = np.empty((len(part), len(centroids)), np.float32)
            numkong.cdist(part, centroids, "dot", out=scores)
        else:
            scores = part @ centroids.T
        cells[start : start + len(part)] = np.argmax(scores, axis=1)
    return cells


def _write_kept(
    path: Path,
    meta: dict[str, Any],
    arrays: dict[str, npt.NDArray[Any]],
    codes: _Codes,
    size: int,
) -> None:
    """Write a scope's copy (``DenseIndex._keep_landed``): its code rows, then its arrays
    and what it is, each to a temporary file renamed into place; a reader that finds
    one file of one copy and the other of another sees the checksum differ."""
    try:
        background()
        path.parent.mkdir(parents=True, exist_ok=True)
        _drop_stale(path.parent.glob(path.name + ".*.tmp"))
        crc = 0
        with _renamed(path.with_name(path.name + ".codes")) as out:
            for start in range(0, size, 16 * BLOCK):
                stop = min(size, start + 16 * BLOCK)
                with codes.rows() as rows:  # mapped a block at a time, not all at once
                    parts = [part.tobytes() for _, part in rows.span(start, stop)]
                    del rows
                for block in parts:
                    crc = zlib.crc32(block, crc)
                    out.write(block)
        with _renamed(path.with_name(path.name + ".npz")) as out:
            savez: Any = np.savez  # typed as if the arrays could be its allow_pickle
            savez(out, meta=np.asarray(json.dumps({**meta, "crc": crc})), **arrays)
    except OSError as exc:  # a read-only or full disk: the next process loads from vec0
        log.info("could not keep the vectors of %s: %s", meta.get("scope"), exc)


@contextlib.contextmanager
def _renamed(target: Path) -> Iterator[IO[bytes]]:
    """A file written beside ``target`` and renamed onto it once complete."""
    with tempfile.NamedTemporaryFile(
        dir=target.parent, prefix=target.name + ".", suffix=".tmp", delete=False
    ) as out:
        try:
            yield out
        except BaseException:
            out.close()
            Path(out.name).unlink(missing_ok=True)
            raise
    os.replace(out.name, target)


def _drop_stale(leftovers: Iterable[Path], age_s: float = 3600.0) -> None:
    """Remove those of ``leftovers`` (files writers that died left behind) an hour old."""
    now = time.time()
    for leftover in leftovers:
        with contextlib.suppress(OSError):
            if now - leftover.stat().st_mtime > age_s:
                leftover.unlink()


def _read_kept(
    path: Path,
    meta: dict[str, Any],
    arrays: dict[str, npt.NDArray[Any]],
    codes: npt.NDArray[np.int16],
    dim: int,
    folder: Path | None,
) -> _Segment | None:
    """A segment from a kept copy (``codes``: this process's code of each saved name),
    or None if its files do not hold what its record says."""
    size = int(meta["size"])
    if any(len(arrays[name]) != size for name in _KEPT_ARRAYS):
        return None
    named = np.concatenate([arrays["corpus"], arrays["kind"]])
    if len(named) and not 0 <= int(named.min()) <= int(named.max()) < len(codes):
        return None
    segment = _Segment(dim, folder)
    try:
        with contextlib.ExitStack() as undo:
            source = undo.enter_context(path.with_name(path.name + ".codes").open("rb"))
            # mapped where the segment's own rows would be in a file, else copied
            copied = None if size and _mappable(source, folder) else _Codes(dim, size)
            crc, at = 0, 0
            # one buffer, reused (new ones: 0.1 s for 176 MB), of 6 MB: a small one gave the
            # GIL back 450 times, and beside the MCP SDK's import at start waited 0.4 s
            buffer = bytearray(16 * BLOCK * dim)
            while read := source.readinto(buffer):
                block = memoryview(buffer)[:read]
                rows = read // dim
                if read % dim or at + rows > size:
                    return None
                crc = zlib.crc32(block, crc)
                if copied is not None:
                    copied.write(at, np.frombuffer(block, np.int8).reshape(rows, dim))
                at += rows
            if at != size or crc != meta["crc"]:
                return None
            if copied is None:
                segment.codes = _Codes(dim, size, folder, base=source, base_rows=size)
                undo.pop_all()  # the codes keep the file open
            else:
                segment.codes = copied
    except OSError:
        return None
    segment.scale, segment.rowid, segment.cell = arrays["scale"], arrays["rowid"], arrays["cell"]
    segment.corpus = codes[arrays["corpus"]]
    segment.kind = codes[arrays["kind"]]
    segment.centroids = arrays["centroids"]
    segment.size = size
    segment.dead = int((arrays["rowid"] < 0).sum())
    return segment


def kept_copies(folder: Path) -> list[tuple[Path, dict[str, Any] | None]]:
    """The copies kept in ``folder``: each one's path (``.npz`` and ``.codes`` beside
    it) and what it is (None: unreadable). Code files an hour old whose copy has no
    record, and temporary files of writers that died, are removed."""
    found: list[tuple[Path, dict[str, Any] | None]] = []
    for record in sorted(folder.glob("*.npz")):
        meta: dict[str, Any] | None = None
        with contextlib.suppress(OSError, ValueError, KeyError), np.load(record) as data:
            meta = json.loads(str(data["meta"]))
        found.append((record.with_suffix(""), meta))
    orphans = [c for c in folder.glob("*.codes") if not c.with_suffix(".npz").exists()]
    _drop_stale([*folder.glob("*.tmp"), *orphans])
    return found


def drop_kept(path: Path) -> int:
    """Remove a kept copy (a process that maps it goes on with it); the bytes freed."""
    freed = 0
    for suffix in (".npz", ".codes"):
        with contextlib.suppress(OSError):
            file = path.with_name(path.name + suffix)
            size = file.stat().st_size
            file.unlink()
            freed += size
    return freed


def folder_bytes(folder: Path | None) -> int:
    """The bytes of the files in ``folder`` (0 if there is none)."""
    if folder is None or not folder.is_dir():
        return 0
    total = 0
    for file in folder.iterdir():
        with contextlib.suppress(OSError):
            total += file.stat().st_size
    return total


def _mappable(file: IO[bytes], folder: Path | None) -> bool:
    """Whether a kept copy's code file can be mapped where segments keep codes in files."""
    if folder is None or not _FILES_WORK:
        return False
    try:
        mmap.mmap(file.fileno(), 1, prot=mmap.PROT_READ).close()
    except (OSError, ValueError):
        return False
    return True


async def _log_entry(fetch: Fetch, position: int) -> list[Any] | None:
    """The change-log entry ``position`` as a kept copy records it ([seq, embedder]);
    None if the log does not hold it."""
    rows = await fetch("SELECT seq, embedder FROM vector_changes WHERE id = ?", [position])
    return [int(rows[0][0]), str(rows[0][1])] if rows else None


def _int8_query(query: Vector) -> tuple[npt.NDArray[np.int8], float]:
    """A query as int8 codes (its largest coordinate at 127), and the step of a code."""
    peak = float(np.abs(query).max()) if len(query) else 0.0
    step = peak / 127.0 if peak > 0 else 1.0
    return np.round(query / step).astype(np.int8), step


def _units(rows: npt.NDArray[np.int8] | Vector) -> Vector:
    """The rows as float32 unit vectors (zero rows stay zero)."""
    out: Vector = np.array(rows, np.float32)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


Ranking = tuple[npt.NDArray[np.int64], Vector, bool]
"""``DenseIndex.rank``'s answer: rowids, their cosines, and whether every row was scored."""


@dataclass(frozen=True)
class Ahead:
    """A ranking made before the read that takes it (``DenseIndex.rank_ahead``): a
    search ranks its clusters' rows while its lexical branch still holds the reader's
    thread. It stands for that read if the copy has applied no change since and the
    read asks the same (``DenseIndex.taken``)."""

    position: int  # the copy's when it ranked
    vector: Vector
    asked: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]  # scopes, corpora, kinds
    probes: int
    ranking: Ranking


class DenseIndex:
    """The loaded scopes of one vec0 table (one embedder)."""

    def __init__(
        self,
        table: str,
        embedder: str,
        dim: int,
        folder: Path | None = None,
        kept: Path | None = None,
    ) -> None:
        self.table = table
        self.embedder = embedder
        self.dim = dim
        self.folder = folder  # where large scopes keep their codes (``_Codes``)
        # where clustered scopes are kept for the next process (None: not kept)
        self.kept = kept
        self._writers: list[threading.Thread] = []  # kept copies being written
        self.lock = anyio.Lock()
        self.position = -1  # the last vector_changes entry applied; -1: nothing loaded
        self._segments: dict[str, _Segment] = {}
        self._codes: dict[str, int] = {}
        self._jobs: list[_Clustering] = []  # clusterings started, until they end

    def close(self, seconds: float) -> bool:
        """Stop the clusterings still running and wait up to ``seconds`` for their
        threads (blocks: run it in a worker thread). True if none runs any more."""
        for job in self._jobs:
            job.stop()
        deadline = time.monotonic() + seconds
        for job in self._jobs:
            job.thread.join(max(0.0, deadline - time.monotonic()))
        for writer in self._writers:  # a copy cut short is never renamed into place
            writer.join(max(0.0, deadline - time.monotonic()))
        self._jobs = [job for job in self._jobs if job.thread.is_alive()]
        return not self._jobs

    def _code(self, name: str) -> int:
        return self._codes.setdefault(name, len(self._codes))

    @property
    def nbytes(self) -> int:
        """The bytes this process holds (not the files')."""
        return sum(s.nbytes for s in self._segments.values())

    @property
    def file_bytes(self) -> int:
        """The bytes the segments keep in files."""
        return sum(s.codes.file_bytes for s in self._segments.values())

    # Keeping current ---------------------------------------------------------------

    async def prepare(self, fetch: Fetch, scope_keys: Collection[str]) -> None:
        """Catch up with the log, then load the scopes not held yet.

        A load reads the chunks in several statements, so a write committed
        meanwhile can leave a row missing or stale; the load is then tried
        again (the log says whether something was written).

        Raises:
            LayoutError: vec0's chunk tables cannot be read here.
            Moved: writes kept spoiling the load of a scope.
        """
        await self._catch_up(fetch)
        for key in scope_keys:
            for attempt in range(_LOAD_ATTEMPTS):
                if key in self._segments:
                    break
                try:
                    await self._load(fetch, key)
                    # the rows by rowid now, not in the first search (``sort_rowids``)
                    await anyio.to_thread.run_sync(self._segments[key].sort_rowids)
                except LayoutError as exc:
                    if not await self._written_since(fetch):
                        raise
                    if attempt == _LOAD_ATTEMPTS - 1:
                        raise Moved(str(exc)) from exc
                    await self._catch_up(fetch)
        await self.keep_clustered(fetch, scope_keys)

    def holds(self, scope_keys: Collection[str]) -> bool:
        """Whether these scopes are loaded."""
        return all(key in self._segments for key in scope_keys)

    def current(self, conn: sqlite3.Connection) -> bool:
        """Whether no vector was written since ``position`` (on ``conn``'s thread)."""
        row = conn.execute("SELECT coalesce(max(id), 0) FROM vector_changes").fetchone()
        return int(row[0]) == self.position

    async def keep_clustered(self, fetch: Fetch, scope_keys: Collection[str]) -> None:
        """Install the clusterings that finished and keep those scopes for the next
        process (``_keep_landed``: a trip only once one landed); start the clusterings
        that would pay (hold ``lock``)."""
        for key in scope_keys:
            segment = self._segments.get(key)
            if segment is not None and not segment.settle() and segment.wants_clusters:
                self._jobs = [job for job in self._jobs if job.thread.is_alive()]
                self._jobs.append(segment.start_clustering())
        await self._keep_landed(fetch, scope_keys)

    async def settle(self, fetch: Fetch, scope_keys: Collection[str], seconds: float) -> bool:
        """Wait up to ``seconds`` for these scopes' clusterings, and for the copies being
        kept (hold ``lock``); True if no clustering is still running."""
        deadline = anyio.current_time() + seconds

        def running() -> list[_Clustering]:
            found = (self._segments.get(key) for key in scope_keys)
            return [s._clustering for s in found if s is not None and s._clustering is not None]

        while True:  # a clustering installed may leave a tail that starts another
            for job in running():
                left = max(0.0, deadline - anyio.current_time())
                await anyio.to_thread.run_sync(job.thread.join, left)
            await self.keep_clustered(fetch, scope_keys)
            if not running() or anyio.current_time() >= deadline:
                break
        for writer in self._writers:  # 180 MB written at 200,000 memories: work of the index
            left = max(0.0, deadline - anyio.current_time())
            await anyio.to_thread.run_sync(writer.join, left)
        return not running()

    async def _written_since(self, fetch: Fetch) -> bool:
        """Whether vectors were written since ``position``."""
        rows = await fetch("SELECT coalesce(max(id), 0) FROM vector_changes", [])
        return int(rows[0][0]) != self.position

    async def _catch_up(self, fetch: Fetch) -> None:
        rows = await fetch(
            "SELECT coalesce((SELECT max(id) FROM vector_changes), 0), "
            "coalesce((SELECT min(id) FROM vector_changes), 0)",
            [],
        )
        newest, oldest = int(rows[0][0]), int(rows[0][1])
        if newest == self.position:
            return
        if (
            self.position < 0
            or newest < self.position
            or oldest > self.position + 1
            or newest - self.position > _RELOAD_AFTER
        ):
            if self._segments:
                log.info("vector index of %s: reloading its scopes", self.embedder)
            for job in self._jobs:  # the clusterings of these scopes can no longer land
                job.stop()
            self._segments.clear()
            self.position = newest
            return
        changed = await fetch(
            "SELECT DISTINCT seq FROM vector_changes WHERE embedder = ? AND id > ? AND id <= ?",
            [self.embedder, self.position, newest],
        )
        await self._reread(fetch, [int(row[0]) for row in changed])
        self.position = newest

    def apply_written(self, before: int, last: int, written: Mapping[int, Written]) -> None:
        """Take a committed transaction's own vector writes (``vectors.Journal``), whose
        log entries run from ``before + 1`` to ``last``, if this copy is at ``before``:
        what ``_catch_up`` would read back from vec0 for them, without reading it."""
        if self.position != before:
            return
        if written and self._segments:
            cleared = [seq for seq, rows in written.items() if rows.cleared]
            if cleared:
                self._drop(np.asarray(cleared, np.int64))
            for rows in written.values():
                key, corpus, kind = rows.partition
                segment = self._segments.get(key)
                if segment is None or not rows.rows:
                    continue
                ids = sorted(rows.rows)
                vectors = np.frombuffer(b"".join(rows.rows[r] for r in ids), np.float32)
                segment.append(
                    np.asarray(ids, np.int64),
                    np.full(len(ids), self._code(corpus), np.int16),
                    np.full(len(ids), self._code(kind), np.int16),
                    vectors.reshape(len(ids), self.dim),
                )
        self.position = last

    def forget(self) -> None:
        """Hold nothing: the next ``prepare`` loads its scopes again."""
        for job in self._jobs:
            job.stop()
        self._segments.clear()
        self.position = -1

    def _drop(self, seqs: npt.NDArray[np.int64]) -> None:
        for segment in self._segments.values():
            segment.drop(seqs)

    async def _reread(self, fetch: Fetch, seqs: Sequence[int]) -> None:
        """Drop what is held of these records, then read the vectors they have now."""
        if not seqs or not self._segments:
            return
        self._drop(np.asarray(seqs, np.int64))
        slots = await fetch(
            "SELECT seq, scope_key, corpus, kind, vec_rows FROM records NOT INDEXED "
            "WHERE seq IN (SELECT value FROM json_each(?)) AND embedder = ? AND live = 1 "
            "AND vec_rows > 0",
            [json.dumps(list(seqs)), self.embedder],
        )
        slots = [s for s in slots if s[1] in self._segments]
        if not slots:
            return
        rowids = [int(seq) * MAX_PASSAGES + i for seq, *_, n in slots for i in range(int(n))]
        found = await self._read_rows(fetch, rowids)
        # each scope's rows in one append (one per record: 26 of the 100 ms that 1,000
        # records took to read again at 50,000 memories)
        rows: dict[str, tuple[list[int], list[int], list[int]]] = {}
        for seq, key, corpus, kind, count in slots:
            first = int(seq) * MAX_PASSAGES
            ids = [r for r in range(first, first + int(count)) if r in found]
            held = rows.setdefault(key, ([], [], []))
            held[0].extend(ids)
            held[1].extend([self._code(corpus)] * len(ids))
            held[2].extend([self._code(kind)] * len(ids))
        for key, (ids, corpora, kinds) in rows.items():
            if ids:
                vectors = np.frombuffer(b"".join(found[r] for r in ids), np.float32)
                self._segments[key].append(
                    np.asarray(ids, np.int64),
                    np.asarray(corpora, np.int16),
                    np.asarray(kinds, np.int16),
                    vectors.reshape(len(ids), self.dim),
                )

    async def _read_rows(self, fetch: Fetch, rowids: Sequence[int]) -> dict[int, bytes]:
        """The stored vectors of these vec0 rows (rows that are not there are left out)."""
        # A join on rowid is a point lookup in vec0 (a range or IN list is a full scan).
        rows = await fetch(
            f"SELECT j.value, v.embedding FROM json_each(?) j JOIN {self.table} v "
            "ON v.rowid = j.value",
            [json.dumps(list(rowids))],
        )
        return {int(rowid): bytes(blob) for rowid, blob in rows}

    async def _load(self, fetch: Fetch, scope_key: str) -> None:
        """Read one scope's rows from vec0's chunk tables, one chunk at a time."""
        layout = await fetch(
            f"SELECT key, value FROM {self.table}_info "
            "WHERE key IN ('CREATE_VERSION_MAJOR', 'CREATE_VERSION_MINOR')",
            [],
        )
        version = {str(k): str(v) for k, v in layout}
        found = (version.get("CREATE_VERSION_MAJOR"), version.get("CREATE_VERSION_MINOR"))
        if found != _SUPPORTED_LAYOUT:
            raise LayoutError(f"{self.table} has sqlite-vec layout {found}")
        if await self._from_kept(fetch, scope_key):
            return
        slots = await fetch(
            f"SELECT seq, corpus, kind FROM records WHERE {HELD}", [scope_key, self.embedder]
        )
        owners = self._owners(slots)
        chunks = await fetch(
            f"SELECT chunk_id, size, validity, rowids FROM {self.table}_chunks "
            "WHERE partition00 = ? ORDER BY chunk_id",
            [scope_key],
        )
        segment = _Segment(self.dim, self.folder)
        for chunk_id, size, validity, rowid_blob in chunks:
            blob = await fetch(
                f"SELECT vectors FROM {self.table}_vector_chunks00 WHERE rowid = ?", [chunk_id]
            )
            if not blob:
                raise LayoutError(f"chunk {chunk_id} of {self.table} has no vectors")
            vectors = np.frombuffer(bytes(blob[0][0]), np.float32)
            rowids = np.frombuffer(bytes(rowid_blob), np.int64)
            size = int(size)
            if len(vectors) < size * self.dim or len(rowids) < size:
                raise LayoutError(f"chunk {chunk_id} of {self.table} is shorter than its size")
            valid = np.unpackbits(np.frombuffer(bytes(validity), np.uint8), bitorder="little")
            keep = np.flatnonzero(valid[:size])
            keep, corpus, kind = owners.of(rowids[keep] // MAX_PASSAGES, keep)
            if not len(keep):
                continue
            segment.append(
                rowids[keep].copy(),
                corpus,
                kind,
                _rows(vectors[: size * self.dim].reshape(size, self.dim), keep),
            )
        await self._check(fetch, segment)
        self._segments[scope_key] = segment

    def _owners(self, slots: Sequence[Any]) -> _Owners:
        """The records whose rows a load keeps (``slots``: seq, corpus, kind), with their
        corpus and kind codes, for looking up a chunk's rows all at once."""
        seq = np.fromiter((int(row[0]) for row in slots), np.int64, len(slots))
        names = {name for row in slots for name in (row[1], row[2])}
        code = {name: self._code(name) for name in sorted(names)}
        corpus = np.fromiter((code[row[1]] for row in slots), np.int16, len(slots))
        kind = np.fromiter((code[row[2]] for row in slots), np.int16, len(slots))
        order = np.argsort(seq, kind="stable")
        return _Owners(seq[order], corpus[order], kind[order])

    # A copy kept across processes --------------------------------------------------

    def _kept_path(self, scope_key: str) -> Path | None:
        """Where a scope's kept copy lives (``.npz`` and ``.codes`` beside each other)."""
        if self.kept is None:
            return None
        name = hashlib.sha256(scope_key.encode()).hexdigest()[:24]
        return self.kept / f"{self.table}-{name}"

    def _kept_identity(self, scope_key: str) -> dict[str, Any]:
        return {
            "format": _KEPT_FORMAT,
            "table": self.table,
            "embedder": self.embedder,
            "dim": self.dim,
            "scope": scope_key,
        }

    async def _keep_landed(self, fetch: Fetch, scope_keys: Collection[str]) -> None:
        """Write, in a thread, the scopes whose clustering landed since they were last
        kept, or whose copy is more than ``_KEEP_EVERY`` log entries behind (hold
        ``lock``): the arrays are copied now, the code rows (never written again) as
        the thread goes."""
        for key in scope_keys:
            segment = self._segments.get(key)
            if segment is None or segment.centroids is None:
                continue
            behind = segment.kept_at is not None and self.position - segment.kept_at > _KEEP_EVERY
            if not (segment.landed or behind):
                continue
            segment.landed = False
            segment.kept_at = self.position  # tried once here, kept or not
            path = self._kept_path(key)
            entry = await _log_entry(fetch, self.position)
            if path is None or entry is None:  # not kept, or nothing in the log to tie it to
                continue
            size = segment.size
            meta = {
                **self._kept_identity(key),
                "position": self.position,
                "entry": entry,
                "size": size,
                "names": sorted(self._codes, key=self._codes.__getitem__),
            }
            arrays = {name: getattr(segment, name)[:size].copy() for name in _KEPT_ARRAYS}
            assert segment.centroids is not None
            arrays["centroids"] = segment.centroids.copy()
            writer = threading.Thread(
                target=_write_kept,
                args=(path, meta, arrays, segment.codes, size),
                name="vector-copy-kept",
                daemon=True,
            )
            self._writers = [w for w in self._writers if w.is_alive()]
            self._writers.append(writer)
            writer.start()

    async def _from_kept(self, fetch: Fetch, scope_key: str) -> bool:
        """Take the scope from the copy an earlier process kept, brought up to date with
        the log since; False (nothing taken) if there is none, or it cannot be trusted.

        It is trusted when it is this table's and scope's, the log still holds the
        entry it was kept at, unchanged (a store restored from a backup, or another
        store's file, has another), its code rows read back with their checksum, the
        rows the log names since are read again, and then it holds as many rows as the
        records say they have and three of them match vec0's own.
        """
        path = self._kept_path(scope_key)
        if path is None:
            return False
        try:
            with np.load(path.with_name(path.name + ".npz")) as data:
                meta = json.loads(str(data["meta"]))
                arrays = {name: data[name] for name in (*_KEPT_ARRAYS, "centroids")}
        except FileNotFoundError:
            return False
        except (OSError, ValueError, KeyError) as exc:
            log.info("ignoring the kept vectors of %s: %s", scope_key, exc)
            return False
        wanted = self._kept_identity(scope_key)
        if {k: meta.get(k) for k in wanted} != wanted or meta["position"] > self.position:
            return False
        entry = await _log_entry(fetch, meta["position"])
        if entry is None or entry != meta["entry"]:
            return False
        codes = np.asarray([self._code(str(name)) for name in meta["names"]], np.int16)

        async def since() -> tuple[list[Any], int]:
            changed = await fetch(
                "SELECT DISTINCT seq FROM vector_changes WHERE embedder = ? AND id > ? AND id <= ?",
                [self.embedder, meta["position"], self.position],
            )
            rows = await fetch(
                f"SELECT coalesce(sum(vec_rows), 0) FROM records WHERE {HELD}",
                [scope_key, self.embedder],
            )
            return changed, int(rows[0][0])

        # the records' reads (70 ms at 200,000 memories) while the file is read
        (changed, held), segment = await alongside(
            since,
            partial(
                anyio.to_thread.run_sync,
                _read_kept,
                path,
                meta,
                arrays,
                codes,
                self.dim,
                self.folder,
            ),
        )
        if segment is None or len(changed) > _RELOAD_AFTER:
            return False
        self._segments[scope_key] = segment
        try:
            await self._reread(fetch, [int(row[0]) for row in changed])
            if held != segment.size - segment.dead:
                raise LayoutError(f"{held} rows in the records")
            await self._check(fetch, segment)
        except LayoutError as exc:
            log.info("ignoring the kept vectors of %s: %s", scope_key, exc)
            del self._segments[scope_key]
            return False
        segment.landed = len(changed) > _KEEP_AGAIN_AFTER  # the next process reads less
        segment.kept_at = int(meta["position"])
        return True

    async def _check(self, fetch: Fetch, segment: _Segment) -> None:
        """Compare a few loaded rows (the first, middle and last live ones) with what vec0
        itself returns for them.

        Live ones: a kept copy holds the rows that the records read again since dropped
        (-1), and a check of those refused every copy whose first, middle or last record
        had been folded or archived since: the next process read the chunks again and
        clustered anew (1.5-2.6 s to the first search at 50,000 memories).
        """
        live = np.flatnonzero(segment.rowid[: segment.size] >= 0)
        if not len(live):
            return
        picks = sorted({int(live[0]), int(live[len(live) // 2]), int(live[-1])})
        read = await self._read_rows(fetch, [int(segment.rowid[i]) for i in picks])
        truth = {r: np.frombuffer(b, np.float32) for r, b in read.items()}
        for i in picks:
            exact = truth.get(int(segment.rowid[i]))
            if exact is None:
                raise LayoutError(f"row {int(segment.rowid[i])} is not in {self.table}")
            norm = float(np.linalg.norm(exact))
            held = segment.vectors(np.asarray([i]))[0]
            if norm > 0 and float(np.abs(held - exact / norm).max()) > 0.02:
                raise LayoutError(f"row {int(segment.rowid[i])} of {self.table} reads wrong")

    # Searching ---------------------------------------------------------------------

    def rank(
        self,
        query: Vector,
        scope_keys: Collection[str],
        corpora: Collection[str],
        kinds: Collection[str],
        *,
        exact: bool = True,
        probes: int | None = None,
    ) -> tuple[npt.NDArray[np.int64], Vector, bool]:
        """The rowids and cosines of the rows in these scopes, corpora and kinds: every
        row if ``exact``, else those of the ``probes`` clusters nearest ``query`` in
        clustered scopes (``_Segment.probe``). The flag says whether every row was
        scored."""
        unit = _unit(query)
        corpus_ok = self._allowed(corpora)
        kind_ok = self._allowed(kinds) if kinds else None
        all_ids: list[npt.NDArray[np.int64]] = []
        all_sims: list[Vector] = []
        every = True
        for key in scope_keys:
            segment = self._segments.get(key)
            if segment is None or not segment.size:
                continue
            probed = None if exact else segment.probe(unit, corpus_ok, kind_ok, probes)
            if probed is None:
                keep = segment.passing(corpus_ok, kind_ok, slice(0, segment.size))
                passing = np.flatnonzero(keep)
                if len(passing) <= _GATHER_SHARE * segment.size:  # a kind's: those only
                    all_ids.append(segment.rowid[passing])
                    all_sims.append(segment.cosines_at(unit, passing))
                    continue
                at: npt.NDArray[np.int64] | slice = slice(0, segment.size)
                sims = segment.cosines(unit, keep)
            else:
                at, sims, keep = probed
                every = False
            all_ids.append(segment.rowid[at][keep])
            all_sims.append(sims[keep])
        if not all_ids:
            return np.zeros(0, np.int64), np.zeros(0, np.float32), True
        return np.concatenate(all_ids), np.concatenate(all_sims), every

    def rank_ahead(
        self,
        query: Vector,
        scope_keys: Collection[str],
        corpora: Collection[str],
        kinds: Collection[str],
        probes: int,
    ) -> Ahead:
        """``rank`` of the clusters nearest ``query``, kept for a read to come (hold
        ``lock``: no change can land meanwhile)."""
        asked = (tuple(scope_keys), tuple(corpora), tuple(kinds))
        ranking = self.rank(query, *asked, exact=False, probes=probes)
        return Ahead(self.position, query, asked, probes, ranking)

    def taken(
        self,
        ahead: Ahead | None,
        query: Vector,
        scope_keys: Collection[str],
        corpora: Collection[str],
        kinds: Collection[str],
        probes: int,
    ) -> Ranking | None:
        """``ahead``'s ranking if it is what ``rank`` would answer now: the same question,
        and no change applied since (on the thread that checked ``current``)."""
        if ahead is None or ahead.position != self.position or ahead.probes != probes:
            return None
        if ahead.asked != (tuple(scope_keys), tuple(corpora), tuple(kinds)):
            return None
        return ahead.ranking if np.array_equal(ahead.vector, query) else None

    def _allowed(self, names: Collection[str]) -> npt.NDArray[np.bool_]:
        """A lookup table: which corpus or kind codes are among ``names``."""
        table = np.zeros(len(self._codes) + 1, np.bool_)
        table[[self._codes[n] for n in names if n in self._codes]] = True
        return table

    def cosines_of(self, query: Vector, rowids: Collection[int]) -> dict[int, float]:
        """The cosine of each of these rows that the index holds."""
        unit = _unit(query)
        wanted = np.asarray(list(rowids), np.int64)
        out: dict[int, float] = {}
        for segment in self._segments.values():
            at = segment.find(wanted)
            if not len(at):
                continue
            sims = (segment.codes.take(at).astype(np.float32) @ unit) * segment.scale[at]
            out.update(zip(segment.rowid[at].tolist(), sims.tolist(), strict=True))
        return out

    def vectors_of(self, rowids: Collection[int]) -> tuple[npt.NDArray[np.int64], Vector]:
        """The rows among these that the index holds, by rowid, and their vectors
        (from the int8 codes: unit length to about 1%)."""
        wanted = np.asarray(list(rowids), np.int64)
        found: list[npt.NDArray[np.int64]] = []
        held: list[Vector] = []
        for segment in self._segments.values():
            at = segment.find(wanted)
            if len(at):
                found.append(segment.rowid[at])
                held.append(segment.vectors(at))
        if not found:
            return np.zeros(0, np.int64), np.zeros((0, self.dim), np.float32)
        if len(found) == 1:  # one scope's rows, each a copy made for this call
            rowid, vectors = found[0], held[0]
        else:
            rowid, vectors = np.concatenate(found), np.concatenate(held)
        if len(rowid) > 1 and not bool((rowid[1:] > rowid[:-1]).all()):
            order = np.argsort(rowid, kind="stable")
            rowid, vectors = rowid[order], vectors[order]
        return rowid, vectors


@dataclass(frozen=True)
class _Owners:
    """Records by ``seq`` (ascending), with their corpus and kind codes."""

    seq: npt.NDArray[np.int64]
    corpus: npt.NDArray[np.int16]
    kind: npt.NDArray[np.int16]

    def of(
        self, seqs: npt.NDArray[np.int64], positions: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int16], npt.NDArray[np.int16]]:
        """The ``positions`` whose ``seqs`` are among these records', with the records'
        corpus and kind codes (a binary search for all of them at once: a set lookup per
        row took 2.4 s of the 7.1 s that loading 435,000 rows took)."""
        if not len(self.seq):
            return positions[:0], self.corpus[:0], self.kind[:0]
        at = np.minimum(np.searchsorted(self.seq, seqs), len(self.seq) - 1)
        found = self.seq[at] == seqs
        at = at[found]
        return positions[found], self.corpus[at], self.kind[at]


def _rows(matrix: Vector, positions: npt.NDArray[np.int64]) -> Vector:
    """The rows of ``matrix`` at ``positions`` (ascending): a view when they are all of
    them, else a copy."""
    if len(positions) == len(matrix):
        return matrix
    picked: Vector = matrix[positions]
    return picked


def _unit(vector: Vector) -> Vector:
    """One vector as a float32 unit vector (``_units`` of a single row)."""
    unit: Vector = _units(np.reshape(vector, (1, -1)))[0]
    return unit
