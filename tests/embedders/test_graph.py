"""A model's graph without its per-run shape arithmetic gives the same outputs, bit for bit."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from memory_mcp.embedders import graph
from memory_mcp.embedders.graph import Unchanged, streamline, streamlined


def _encoder(*, nan_pass: bool = True, computed_shapes: bool = True) -> onnx.ModelProto:
    """A one-head-pair attention layer shaped like a sentence-transformers export: the
    heads' Reshape targets computed from the input's shape at each run, and
    Where(IsNaN(p), 0, p) after the softmax."""
    rng = np.random.default_rng(3)
    weights = {
        "table": rng.normal(size=(2000, 8)).astype(np.float32),
        "zero": np.zeros((), np.float32),
        "heads": np.array([2], np.int64),
        "width": np.array([4], np.int64),
        "minus": np.array([-1], np.int64),
        "at0": np.array(0, np.int64),
        "at1": np.array(1, np.int64),
        "axes": np.array([0], np.int64),
        "split": np.array([0, 0, 2, 4], np.int64),
        "merge": np.array([0, 0, -1], np.int64),
    }
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["x"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "minus"], ["mask3"]),
        helper.make_node("Mul", ["x", "mask3"], ["xm"]),
    ]
    if computed_shapes:
        nodes += [
            helper.make_node("Shape", ["xm"], ["shape"]),
            helper.make_node("Gather", ["shape", "at0"], ["b"]),
            helper.make_node("Gather", ["shape", "at1"], ["s"]),
            helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
            helper.make_node("Unsqueeze", ["s", "axes"], ["s1"]),
            helper.make_node("Concat", ["b1", "s1", "heads", "width"], ["split_to"], axis=0),
            helper.make_node("Concat", ["b1", "s1", "minus"], ["merge_to"], axis=0),
        ]
    split, merge = ("split_to", "merge_to") if computed_shapes else ("split", "merge")
    nodes += [
        helper.make_node("Reshape", ["xm", split], ["h"]),
        helper.make_node("Transpose", ["h"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["h"], ["k"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["q", "k"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
    ]
    attended = "p"
    if nan_pass:
        nodes += [
            helper.make_node("IsNaN", ["p"], ["nan"]),
            helper.make_node("Where", ["nan", "zero", "p"], ["p_clean"]),
        ]
        attended = "p_clean"
    nodes += [
        helper.make_node("MatMul", [attended, "q"], ["context"]),
        helper.make_node("Transpose", ["context"], ["back"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["back", merge], ["last_hidden_state"]),
    ]
    return _text_model("encoder", nodes, weights, width=8)


def _text_model(
    name: str, nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray], *, width: int
) -> onnx.ModelProto:
    """A checked model of ``nodes`` from token ids and a mask to ``last_hidden_state``."""
    dims = ["batch", "length"]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            name,
            [
                helper.make_tensor_value_info("input_ids", TensorProto.INT64, dims),
                helper.make_tensor_value_info("attention_mask", TensorProto.INT64, dims),
            ],
            [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [*dims, width])],
            [numpy_helper.from_array(v, k) for k, v in constants.items()],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    onnx.checker.check_model(model)
    return model


def _outputs(model: onnx.ModelProto, batch: int, length: int) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out: np.ndarray = session.run(None, graph._feed(session, batch, length))[0]
    return out


def test_a_streamlined_graph_reads_constant_shapes_and_gives_the_same_outputs() -> None:
    model = _encoder()
    fast, summary = streamline(model)
    kinds = [n.op_type for n in fast.graph.node]
    assert "Shape" not in kinds and "Concat" not in kinds and "IsNaN" not in kinds
    assert "2 reshapes given constant shapes, 1 NaN passes dropped" in summary
    targets = {
        tuple(numpy_helper.to_array(t).tolist())
        for t in fast.graph.initializer
        if t.name.endswith("constant_shape")
    }
    assert targets == {(0, 0, 2, 4), (0, 0, -1)}
    for batch, length in [(1, 1), (2, 9), (5, 40)]:  # shapes neither probed nor checked
        assert _outputs(fast, batch, length).tobytes() == _outputs(model, batch, length).tobytes()


def test_a_graph_without_shape_arithmetic_is_left_as_it_is() -> None:
    with pytest.raises(Unchanged, match="no shape arithmetic"):
        streamline(_encoder(nan_pass=False, computed_shapes=False))


def test_a_rewrite_that_would_change_the_outputs_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The copy is kept only if it gives the original's outputs bit for bit."""
    real = graph._constant_target

    def swapped(seen: list[tuple[list[int], list[int]]]) -> list[int] | None:
        target = real(seen)
        return [0, 0, 4, 2] if target == [0, 0, 2, 4] else target  # heads of another width

    monkeypatch.setattr(graph, "_constant_target", swapped)
    with pytest.raises(Unchanged, match="outputs would change"):
        streamline(_encoder())


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        ([((1, 7, 384), [1, 7, -1, 32]), ((3, 11, 384), [3, 11, -1, 32])], [0, 0, -1, 32]),
        ([((1, 12, 7, 32), [1, -1, 7, 32]), ((3, 12, 11, 32), [3, -1, 11, 32])], [0, -1, 0, 32]),
        ([((1, 7, 12, 32), [7, 384]), ((3, 11, 12, 32), [33, 384])], [-1, 384]),
        ([((2, 6), [6, 2]), ((3, 4), [4, 3])], None),  # two dimensions to infer
        ([((2, 6), [2, 6]), ((2, 6, 1), [2, 6])], [2, 6]),
    ],
)
def test_a_reshape_target_is_the_one_every_probe_run_agrees_with(
    seen: list[tuple[tuple[int, ...], list[int]]], expected: list[int] | None
) -> None:
    assert graph._constant_target(seen) == expected


def test_the_copy_is_made_once_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "model" / "model.onnx"
    source.parent.mkdir()
    onnx.save(_encoder(), str(source))
    cache = tmp_path / "cache"
    made = streamlined(source, cache)
    assert made is not None and made.parent == cache and made.is_file()
    assert not list(cache.glob("*.partial"))
    copy = onnx.load(str(made))
    assert _outputs(copy, 3, 10).tobytes() == _outputs(_encoder(), 3, 10).tobytes()

    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("made again")

    monkeypatch.setattr(subprocess, "run", no_child)
    assert streamlined(source, cache) == made
    monkeypatch.undo()

    onnx.save(_encoder(nan_pass=False), str(source))  # a new model file: a new copy
    again = streamlined(source, cache)
    assert again is not None and again != made


def test_the_copy_is_kept_whatever_encoding_the_locale_prints_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's summary has a "→", which cp1252 or ASCII output cannot print: it
    writes UTF-8 to its parent, so the copy it made is not thrown away."""
    monkeypatch.setenv("PYTHONIOENCODING", "ascii")
    source = tmp_path / "model.onnx"
    onnx.save(_encoder(), str(source))
    assert streamlined(source, tmp_path / "cache") is not None


def test_a_model_left_as_it_is_is_noted_and_not_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "model.onnx"
    onnx.save(_encoder(nan_pass=False, computed_shapes=False), str(source))
    cache = tmp_path / "cache"
    assert streamlined(source, cache) is None
    (noted,) = cache.glob("*.unchanged")
    assert "no shape arithmetic" in noted.read_text(encoding="utf-8")

    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("tried again")

    monkeypatch.setattr(subprocess, "run", no_child)
    assert streamlined(source, cache) is None


def test_a_file_it_cannot_read_as_a_model_is_noted_and_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's doing: noted (with the reason) like a model with nothing to fold, so
    that each load does not try again; no copy, no partial file."""
    source = tmp_path / "model.onnx"
    source.write_bytes(b"not a model")
    cache = tmp_path / "cache"
    assert streamlined(source, cache) is None
    (noted,) = cache.iterdir()
    assert noted.suffix == ".unchanged"
    assert "cannot be rewritten" in noted.read_text(encoding="utf-8")
    monkeypatch.setattr(subprocess, "run", _no_child)
    assert streamlined(source, cache) is None


def test_a_copy_the_machine_could_not_make_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that failed for the machine's reasons (no onnx package, a full disk):
    nothing noted, nothing left, the next load makes the copy."""
    source = tmp_path / "model.onnx"
    onnx.save(_encoder(), str(source))
    cache = tmp_path / "cache"
    real_run = subprocess.run

    def failing(*args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess([], 1, "", "OSError: [Errno 28] No space left")

    monkeypatch.setattr(subprocess, "run", failing)
    assert streamlined(source, cache) is None
    assert not list(cache.iterdir())
    monkeypatch.setattr(subprocess, "run", real_run)
    assert streamlined(source, cache) is not None


def test_a_cache_it_cannot_write_costs_no_rewrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only cache folder: the model runs as it is without the child's seconds of
    work that could not be kept, at every start."""
    source = tmp_path / "model.onnx"
    onnx.save(_encoder(), str(source))
    cache = tmp_path / "cache"
    cache.mkdir()
    asked: list[Path] = []

    def writable(folder: Path) -> bool:
        asked.append(folder)
        return False  # as a read-only folder answers

    monkeypatch.setattr(graph, "_writable", writable)
    monkeypatch.setattr(subprocess, "run", _no_child)
    assert streamlined(source, cache) is None
    assert asked == [cache]
    assert not list(cache.iterdir())


def test_partial_copies_writers_left_behind_are_removed(tmp_path: Path) -> None:
    """A process killed while it wrote leaves a partial file; a later writer removes it
    once no writer can still be at it, and leaves a recent one alone."""
    source = tmp_path / "model.onnx"
    onnx.save(_encoder(nan_pass=False), str(source))
    cache = tmp_path / "cache"
    cache.mkdir()
    old, recent = cache / "model-1.123-4.partial", cache / "model-1.567-8.partial"
    old.write_bytes(b"cut short")
    recent.write_bytes(b"being written")
    long_ago = time.time() - 3 * graph._TIMEOUT_S
    os.utime(old, (long_ago, long_ago))
    assert streamlined(source, cache) is not None
    assert not old.exists() and recent.exists()


def test_the_copy_is_named_by_the_versions_that_made_and_checked_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new onnxruntime (or onnx) gets its own copy, checked bit for bit again, and
    tries again a model the old one could not rewrite."""
    source = tmp_path / "model.onnx"
    source.write_bytes(b"a model")
    before = graph.copy_path(source, tmp_path)
    graph._versions.cache_clear()
    monkeypatch.setattr(ort, "__version__", "99.0")  # the runtime imported, by any name
    try:
        assert graph.copy_path(source, tmp_path) != before
    finally:
        graph._versions.cache_clear()


def test_a_failure_of_the_machine_in_the_child_is_not_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only errors that say the model cannot be rewritten are noted: onnxruntime failing
    at run time (memory, a provider) leaves nothing noted, and the next load tries."""
    source = tmp_path / "model.onnx"
    onnx.save(_encoder(), str(source))
    target = tmp_path / "copy.onnx"

    def raising(error: Exception) -> None:
        def streamline(model: onnx.ModelProto) -> None:
            raise error

        monkeypatch.setattr(graph, "streamline", streamline)

    raising(MemoryError("cannot allocate"))
    with pytest.raises(MemoryError):
        graph.main([str(source), str(target)])
    raising(RuntimeError("an execution provider failed"))
    with pytest.raises(RuntimeError):
        graph.main([str(source), str(target)])
    raising(KeyError("a name the rewrite did not find"))  # the model's: noted
    assert graph.main([str(source), str(target)]) == graph._UNCHANGED
    assert not target.exists()


def _no_child(*args: object, **kwargs: object) -> None:
    raise AssertionError("the child ran")


def _projection(*, weights: bool = True) -> onnx.ModelProto:
    """Token vectors through one matrix product with constant weights (or none)."""
    rng = np.random.default_rng(5)
    constants = {"table": rng.normal(size=(2000, 16)).astype(np.float32)}
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["x"])]
    if weights:
        constants["w"] = rng.normal(size=(16, 16)).astype(np.float32)
        nodes.append(helper.make_node("MatMul", ["x", "w"], ["y"]))
    nodes.append(helper.make_node("Identity", ["y" if weights else "x"], ["last_hidden_state"]))
    return _text_model("projection", nodes, constants, width=16)


def test_an_int8_copy_quantizes_the_weights_and_stays_near_the_model() -> None:
    small, summary = graph.quantize(_projection())
    assert any(node.op_type == "MatMulInteger" for node in small.graph.node)
    assert "within cosine" in summary
    exact, near = _outputs(_projection(), 2, 9), _outputs(small, 2, 9)
    assert exact.shape == near.shape and exact.tobytes() != near.tobytes()
    rows = exact.reshape(-1, 16), near.reshape(-1, 16)
    cosines = np.sum(rows[0] * rows[1], axis=1) / np.prod(
        [np.linalg.norm(r, axis=1) for r in rows], axis=0
    )
    assert float(cosines.min()) > 0.99


def test_an_int8_copy_that_would_move_the_vectors_too_far_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(graph, "INT8_AGREEMENT", 1.01)  # nothing quantized is that close
    with pytest.raises(Unchanged, match="too far"):
        graph.quantize(_projection())
    with pytest.raises(Unchanged, match="no matrix product"):
        graph.quantize(_projection(weights=False))


def test_the_int8_copy_is_made_once_kept_apart_and_its_refusal_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "model" / "model.onnx"
    source.parent.mkdir()
    onnx.save(_projection(), str(source))
    cache = tmp_path / "cache"
    made, why = graph.quantized(source, cache)
    assert made is not None and why == "" and made.name.endswith(".int8.onnx")
    assert made != graph.copy_path(source, cache)  # not the streamlined copy's place
    assert any(n.op_type == "MatMulInteger" for n in onnx.load(str(made)).graph.node)
    monkeypatch.setattr(subprocess, "run", _no_child)
    assert graph.quantized(source, cache) == (made, "")
    monkeypatch.undo()

    plain = tmp_path / "plain" / "model.onnx"
    plain.parent.mkdir()
    onnx.save(_projection(weights=False), str(plain))
    assert graph.quantized(plain, cache) == (
        None,
        "no matrix product with constant weights to quantize",
    )
    monkeypatch.setattr(subprocess, "run", _no_child)
    none, noted = graph.quantized(plain, cache)
    assert none is None and "no matrix product" in noted


def test_an_int8_copy_of_a_graph_the_rewrite_cannot_read_quantizes_it_as_exported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model the streamlining refuses for any reason of the model's is quantized as
    it is, rather than left without the copy ``embedder.quantize`` asks for."""
    source = tmp_path / "model.onnx"
    onnx.save(_projection(), str(source))
    target = tmp_path / "int8.onnx"

    def unreadable(model: onnx.ModelProto) -> None:
        raise KeyError("a name the rewrite did not find")

    monkeypatch.setattr(graph, "streamline", unreadable)
    assert graph.main(["--int8", str(source), str(target)]) == 0
    assert any(n.op_type == "MatMulInteger" for n in onnx.load(str(target)).graph.node)
