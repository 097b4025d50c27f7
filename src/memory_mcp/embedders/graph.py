"""A model's graph with its shape arithmetic done once: the same vectors, sooner.

A sentence-transformers export computes, at every run, the target shape of each
attention ``Reshape`` from its input's shape (``Shape`` → ``Gather`` →
``Unsqueeze`` → ``Concat``), and passes each softmax through
``Where(IsNaN(p), 0, p)``. onnxruntime runs each of those small nodes in every
call, and a short text's embedding is mostly such per-node costs: all-MiniLM-L6-v2
has 669 nodes, 338 after onnxruntime's own optimizations, 223 without them, and
one short text embeds in 3.96 ms instead of 4.30 (p50 of 900 runs).

``streamline`` rewrites a graph so: a ``Reshape`` whose target two probe runs of
different batch sizes and lengths explain gets a constant target (0 where it is
the input's own dimension, -1 for the one left, else the number); a
``Where(IsNaN(p), 0, p)`` gives ``p`` (a softmax row is never wholly masked: every
input has its first token); nodes nothing reads any more go. It keeps the
result only if it gives the original's outputs bit for bit on inputs of other
shapes, padded ones among them.

``streamlined`` makes the copy once per model file, in a child process (its
``onnx`` import and copies of the weights stay out of the server's memory), and
keeps it in the cache folder, named by the model file and the versions of the
rewrite, onnx and onnxruntime. A model it cannot rewrite (nothing to fold,
outputs that would change, a graph it does not read) is noted there and runs as
it is, until one of those versions changes; a copy that could not be made for
the machine's reasons (no ``onnx`` package, a full disk, a cache folder it
cannot write) is tried again at the next load, and one that will not load is
dropped (``onnx.OnnxModel``) and made again.

``quantized`` (``embedder.quantize``) makes a second kind of copy the same way:
the streamlined graph (or the model as exported) with the weights of its matrix
products in 8 bits, one scale per output column, 7 bits of them used
(onnxruntime's dynamic quantization; the eighth would overflow the int8 dot
products of x86 CPUs without VNNI). Its vectors are not the model's: the copy
is kept only if every pooled output row of the check runs is within cosine
``INT8_AGREEMENT`` of the model's, and its vectors carry their own embedder
name.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)

VERSION = 1  # of the rewrite: a new one makes every copy again
_PROBES = ((1, 7), (3, 11))  # (batch, length) of the runs that explain the shapes
_CHECKS = ((1, 5), (2, 23), (4, 64))  # of the runs that must give the same outputs
_TIMEOUT_S = 300.0
_UNCHANGED = 3  # the child's exit status: nothing to gain, or outputs would differ
INT8 = "int8"  # the kind of a quantized copy (the child's flag, and in its name)
# Of ``quantize``'s recipe: a new one makes the copies again. Its vectors would differ,
# so a new recipe also needs a new embedder name (``base.INT8_MARK``).
INT8_RECIPE = 1
# The least cosine between a check run's pooled output row and the model's that a
# quantized copy may give; all-MiniLM-L6-v2's copy gives 0.98 and more on random tokens.
INT8_AGREEMENT = 0.95


class Unchanged(Exception):
    """The model is better run as it is (the message says why)."""


def streamlined(source: Path, cache: Path) -> Path | None:
    """The streamlined copy of the ONNX file ``source``, made now if ``cache`` lacks it.

    None: run ``source`` as it is (it cannot be streamlined, or the copy could not
    be made; the reason is logged, and noted in the cache so that the next load
    does not try again when the model is the cause).
    """
    made, _ = _copy(source, cache, kind="")
    return made


def quantized(source: Path, cache: Path) -> tuple[Path | None, str]:
    """The int8 copy of the ONNX file ``source`` (streamlined first where it can be),
    made now if ``cache`` lacks it, or None and why it is not there (noted in the
    cache when the model is the cause, as for ``streamlined``)."""
    return _copy(source, cache, kind=INT8)


def _copy(source: Path, cache: Path, *, kind: str) -> tuple[Path | None, str]:
    what = f"{kind} copy" if kind else "streamlined copy"
    target = copy_path(source, cache, kind=kind)
    if target is None:
        return None, f"{source} cannot be read"
    skip = target.with_suffix(".unchanged")
    if target.is_file():
        return target, ""
    if skip.is_file():
        return None, skip.read_text(encoding="utf-8", errors="replace").strip()
    partial = target.with_suffix(f".{os.getpid()}-{threading.get_ident()}.partial")
    flags = [f"--{kind}"] if kind else []
    try:
        cache.mkdir(parents=True, exist_ok=True)
        if not _writable(cache):  # not made only to be lost, at each start
            log.info("cannot write to %s; no %s of %s", cache, what, source)
            return None, f"cannot write to {cache}"
        _drop_stale(cache)
        done = subprocess.run(
            [sys.executable, "-m", "memory_mcp.embedders.graph", *flags, str(source), str(partial)],
            stdin=subprocess.DEVNULL,  # a stdio server's input is the client's channel
            capture_output=True,
            # what it says in UTF-8 whatever the locale (cp1252 cannot print its "→")
            env={**os.environ, "PYTHONIOENCODING": "utf-8"},
            encoding="utf-8",
            errors="replace",
            timeout=_TIMEOUT_S,
            check=False,
        )
        if done.returncode == _UNCHANGED:
            log.info("no %s of %s: %s", what, source, done.stdout.strip())
            skip.write_text(done.stdout, encoding="utf-8")
            return None, done.stdout.strip()
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            log.info("could not make the %s of %s (%s)", what, source, last)
            return None, last
        os.replace(partial, target)
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("could not make the %s of %s (%s)", what, source, exc)
        return None, str(exc)
    finally:
        partial.unlink(missing_ok=True)
    log.info("%s of %s made (%s), kept at %s", what, source, done.stdout.strip(), target)
    return target, ""


def copy_path(source: Path, cache: Path, *, kind: str = "") -> Path | None:
    """Where in ``cache`` the streamlined (or ``kind``) copy of ``source`` is kept:
    named by the file's path, size and time, the rewrite's version and those of
    onnxruntime (which checked it) and onnx (which wrote it); None: no such file."""
    try:
        stat = source.stat()
    except OSError:
        return None
    key = hashlib.sha256(
        f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{VERSION}|{_versions()}"
        f"{f'|{kind}|{INT8_RECIPE}' if kind == INT8 else ''}".encode()
    ).hexdigest()[:16]
    return cache / f"{source.parent.name}-{key}{'.' + kind if kind else ''}.onnx"


@functools.cache
def _versions() -> str:
    """The imported onnxruntime's version (a GPU or DirectML build has its own package
    name) and the installed onnx's."""
    import onnxruntime

    try:
        written_by = metadata.version("onnx")
    except metadata.PackageNotFoundError:
        written_by = "-"
    return f"{onnxruntime.__version__}|{written_by}"


def _writable(folder: Path) -> bool:
    """Whether a file can be made in ``folder`` (``os.access`` says yes to any folder
    on Windows)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def _drop_stale(cache: Path) -> None:
    """Remove what writers killed mid-way left (partial copies older than a writer
    may take)."""
    too_old = time.time() - 2 * _TIMEOUT_S
    for partial in cache.glob("*.partial"):
        with contextlib.suppress(OSError):
            if partial.stat().st_mtime < too_old:
                partial.unlink()


def streamline(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """A copy of ``model`` without its shape arithmetic, checked bit for bit, and what
    changed.

    Raises:
        Unchanged: nothing to gain, or the copy's outputs would differ.
    """
    import onnx

    _weights_inline(model)
    fast = onnx.ModelProto()
    fast.CopyFrom(model)
    graph = fast.graph
    before = len(graph.node)
    fixed = _fix_reshapes(model, graph)
    passed = _drop_nan_passes(graph)
    _drop_unread(graph)
    if not fixed and not passed:
        raise Unchanged("no shape arithmetic to fold")
    original, copy = _session(model.SerializeToString()), _session(fast.SerializeToString())
    for batch, length in _CHECKS:
        feed = _feed(original, batch, length)
        expected, got = original.run(None, feed), copy.run(None, feed)
        if len(expected) != len(got) or not all(
            a.shape == b.shape and a.tobytes() == b.tobytes()
            for a, b in zip(expected, got, strict=True)
        ):
            raise Unchanged(f"its outputs would change (batch {batch}, length {length})")
    return fast, (
        f"{before} → {len(graph.node)} nodes: {fixed} reshapes given constant shapes, "
        f"{passed} NaN passes dropped"
    )


def _weights_inline(model: onnx.ModelProto) -> None:
    """Raise ``Unchanged`` if the model's weights live in other files, which a copy kept
    elsewhere would lose."""
    import onnx

    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        raise Unchanged("its weights are in external files")


def _fix_reshapes(model: onnx.ModelProto, graph: onnx.GraphProto) -> int:
    """Give each ``Reshape`` of ``graph`` whose target is computed a constant one, where
    the probe runs of ``model`` (the same nodes) explain it; how many."""
    import numpy as np
    from onnx import numpy_helper

    constant = {t.name for t in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output
    }
    computed = [
        n
        for n in graph.node
        if n.op_type == "Reshape"
        and n.input[1] not in constant
        and not any(a.name == "allowzero" and a.i for a in n.attribute)  # 0: a zero then
    ]
    if not computed:
        return 0
    runs = _probe(model, [t for n in computed for t in n.input[:2]])
    fixed = 0
    for node in computed:
        data, shape = node.input[0], node.input[1]
        target = _constant_target([(run[data].shape, run[shape].tolist()) for run in runs])
        if target is None:
            continue
        name = f"{node.name or node.output[0]}/constant_shape"
        graph.initializer.append(numpy_helper.from_array(np.array(target, np.int64), name))
        node.input[1] = name
        fixed += 1
    return fixed


def _constant_target(seen: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[int] | None:
    """One ``Reshape`` target that gives, for each (input shape, target asked) seen, the
    shape that target gives; None if there is none of 0s, one -1 and numbers."""
    lengths = {len(asked) for _, asked in seen}
    if len(lengths) != 1:
        return None
    target: list[int] = []
    for j in range(lengths.pop()):
        values = {asked[j] for _, asked in seen}
        if len(values) == 1 and (value := values.pop()) >= 0:
            target.append(value)  # the same number (0: the input's) every time
        elif all(j < len(dims) and asked[j] == dims[j] for dims, asked in seen):
            target.append(0)  # the input's own dimension
        else:
            target.append(-1)
    if target.count(-1) > 1:
        return None
    if any(_reshaped(dims, target) != _reshaped(dims, asked) for dims, asked in seen):
        return None
    return target


def _reshaped(dims: Sequence[int], target: Sequence[int]) -> list[int] | None:
    """The shape ``Reshape`` gives an input of shape ``dims`` for ``target`` (its 0 and
    -1 resolved), or None if it gives none."""
    out = [dims[j] if t == 0 and j < len(dims) else t for j, t in enumerate(target)]
    size = 1
    for d in dims:
        size *= d
    known = 1
    for d in out:
        known *= d if d != -1 else 1
    if out.count(-1) == 1:
        if known == 0 or size % known:
            return None
        out[out.index(-1)] = size // known
    elif out.count(-1) > 1 or known != size:
        return None
    return out


def _drop_nan_passes(graph: onnx.GraphProto) -> int:
    """Have what reads ``Where(IsNaN(p), 0, p)`` after a ``Softmax`` read ``p``; how many."""
    made_by = {o: n for n in graph.node for o in n.output}
    wheres = [n for n in graph.node if n.op_type == "Where" and len(n.input) == 3]
    zeros = _zero_constants(graph, {n.input[1] for n in wheres})
    instead: dict[str, str] = {}
    for node in wheres:
        test, then, p = (made_by.get(node.input[0]), node.input[1], node.input[2])
        source = made_by.get(p)
        if (
            test is not None
            and test.op_type == "IsNaN"
            and test.input[0] == p
            and then in zeros
            and source is not None
            and source.op_type == "Softmax"
        ):
            instead[node.output[0]] = p
    outputs = {o.name for o in graph.output}
    instead = {k: v for k, v in instead.items() if k not in outputs}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in instead:
                node.input[i] = instead[name]
    return len(instead)


def _zero_constants(graph: onnx.GraphProto, names: set[str]) -> set[str]:
    """Those of ``names`` that are constant tensors of the graph whose every value is 0
    (only those are read: the weights are most of a model's bytes)."""
    from onnx import numpy_helper

    tensors = {t.name: t for t in graph.initializer if t.name in names}
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] in names:
            for attribute in node.attribute:
                if attribute.name == "value":
                    tensors[node.output[0]] = attribute.t
    return {name for name, t in tensors.items() if not numpy_helper.to_array(t).astype(bool).any()}


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Remove the nodes and initializers that no graph output depends on."""
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(list(graph.node)):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    initializers = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(initializers)


def _probe(model: onnx.ModelProto, names: Iterable[str]) -> list[dict[str, np.ndarray]]:
    """The values of the named tensors in a run of ``model`` at each ``_PROBES`` shape."""
    import onnx

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    typed = onnx.shape_inference.infer_shapes(model).graph
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in [*typed.value_info, *typed.input, *typed.output]
    }
    present = {o.name for o in probe.graph.output}
    wanted = list(dict.fromkeys(names))
    for name in wanted:
        if name not in present:
            if name not in types:
                raise Unchanged(f"the type of {name} is not known")
            probe.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    session = _session(probe.SerializeToString())
    outputs = [o.name for o in session.get_outputs()]
    runs = []
    for batch, length in _PROBES:
        values = session.run(None, _feed(session, batch, length))
        runs.append(dict(zip(outputs, values, strict=True)))
    return runs


def _session(model: bytes) -> Any:
    """A session with the options the product runs models with."""
    import onnxruntime as ort

    from memory_mcp.embedders.sessions import session_options

    options = session_options()
    options.log_severity_level = 3
    return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])


def _feed(session: Any, batch: int, length: int) -> dict[str, np.ndarray]:
    """Inputs for a text encoder: token ids, an attention mask that pads all but the
    first row, zero token types."""
    import numpy as np

    rng = np.random.default_rng(batch * 1000 + length)
    ids = rng.integers(1000, 2000, size=(batch, length), dtype=np.int64)
    mask = np.ones((batch, length), np.int64)
    for row in range(1, batch):
        mask[row, max(1, length - 3 * row) :] = 0
    feed: dict[str, np.ndarray] = {}
    for node in session.get_inputs():
        if node.name == "input_ids":
            feed[node.name] = ids
        elif node.name == "attention_mask":
            feed[node.name] = mask
        elif node.name == "token_type_ids":
            feed[node.name] = np.zeros_like(ids)
        else:
            raise Unchanged(f"an input it does not know: {node.name}")
    return feed


def _model_errors() -> tuple[type[Exception], ...]:
    """The errors that say the model (as these versions read it) cannot be rewritten:
    a file that is no model, a graph onnx or onnxruntime refuses, one the rewrite does
    not follow."""
    import onnx
    from google.protobuf.message import DecodeError
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

    return (
        DecodeError,
        onnx.checker.ValidationError,
        onnx.shape_inference.InferenceError,
        ort_errors.InvalidArgument,
        ort_errors.InvalidGraph,
        ort_errors.InvalidProtobuf,
        ort_errors.NotImplemented,
        KeyError,
        IndexError,
        ValueError,
    )


def quantize(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """``model`` with its matrix products' weights in int8 (per column, 7 bits), if
    every pooled output row of the check runs stays within ``INT8_AGREEMENT``.

    Raises:
        Unchanged: nothing to quantize, or vectors that would move too far.
    """
    import numpy as np
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from memory_mcp.embedders.base import normalize_rows

    _weights_inline(model)
    with tempfile.TemporaryDirectory() as folder:  # it writes a file; read back here
        written = Path(folder) / "int8.onnx"
        quantize_dynamic(
            model,
            written,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            reduce_range=True,
            weight_type=QuantType.QInt8,
        )
        small = onnx.load(str(written))
    ops = sum(node.op_type == "MatMulInteger" for node in small.graph.node)
    if not ops:
        raise Unchanged("no matrix product with constant weights to quantize")
    original, copy = _session(model.SerializeToString()), _session(small.SerializeToString())
    least = 1.0
    for batch, length in _CHECKS:
        feed = _feed(original, batch, length)
        mask = feed.get("attention_mask", np.ones_like(feed["input_ids"]))[:, :, None]
        pooled = [
            (out[0] * mask).sum(axis=1) for out in (original.run(None, feed), copy.run(None, feed))
        ]
        a, b = (normalize_rows(p) for p in pooled)
        least = min(least, float(np.sum(a * b, axis=1).min()))
    if least < INT8_AGREEMENT:
        raise Unchanged(f"int8 weights would move its vectors too far (cosine {least:.3f})")
    return small, (
        f"{ops} matrix products in int8, pooled outputs within cosine {least:.4f} of the model's"
    )


def main(argv: Sequence[str]) -> int:
    """``python -m memory_mcp.embedders.graph [--int8] SOURCE TARGET``: write the
    streamlined copy (and with ``--int8`` quantize it)."""
    try:
        import onnx
    except ImportError:  # not the model's doing: the next load tries again
        print("the onnx package is not installed", file=sys.stderr)
        return 1
    int8 = f"--{INT8}" in argv
    source, target = (Path(a) for a in argv if a != f"--{INT8}")
    try:
        model = onnx.load(str(source), load_external_data=False)
        refused: tuple[type[Exception], ...] = (Unchanged, *_model_errors())
        try:
            model, summary = streamline(model)
        except refused as exc:
            if not int8:
                raise
            summary = f"not streamlined ({exc})"[:300]  # the model as exported is quantized
        if int8:
            model, quantized = quantize(model)
            summary = f"{summary}; {quantized}"
    except Unchanged as exc:
        print(exc)
        return _UNCHANGED
    except _model_errors() as exc:  # its key changes with onnx's and onnxruntime's versions
        print(f"it cannot be rewritten: {type(exc).__name__}: {exc}"[:500])
        return _UNCHANGED
    # Anything else (memory, the disk, an onnxruntime failure at run time) is the
    # machine's: the child fails and the next load tries again.
    onnx.save(model, str(target))
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
