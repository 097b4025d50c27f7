"""The model run directly on onnxruntime gives fastembed's vectors, and loads without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.model import MODEL_NAME, model_path
from memory_mcp.embedders.fastembed import FOLDERS_FILE, FastEmbedEmbedder
from memory_mcp.errors import EmbedderError, ModelNotLocal

TEXTS = [
    "We deploy with GitHub Actions to Fly.io",
    "x",
    "Ünïcödé — naïve café, 東京, emoji 🚀 and `code_blocks()`",
    " ".join(f"word{i}" for i in range(400)),  # past the 256-token window
    "The API listens on port 8080. " * 12,
]


def test_the_direct_runner_gives_the_vectors_fastembed_gives(
    real_embedder: FastEmbedEmbedder,
) -> None:
    from fastembed import TextEmbedding

    reference = TextEmbedding(MODEL_NAME, specific_model_path=str(model_path()))
    reference.model.tokenizer.enable_truncation(max_length=256)  # as the product sets it
    expected = np.asarray(list(reference.embed(TEXTS, batch_size=2)), dtype=np.float32)
    got = real_embedder.embed(TEXTS)
    assert real_embedder._direct is not None  # not fastembed's own runner
    assert got.shape == expected.shape == (len(TEXTS), 384)
    assert float(np.abs(got - expected).max()) < 1e-5
    one_by_one = np.stack([real_embedder.embed([text])[0] for text in TEXTS])
    assert float(np.abs(one_by_one - got).max()) < 1e-5  # batching does not change a vector


def test_the_streamlined_graph_gives_the_models_vectors_bit_for_bit(
    real_embedder: FastEmbedEmbedder, tmp_path: Path
) -> None:
    """The product runs the model's streamlined copy (``embedders.graph``), made in the
    cache folder on first load; its vectors are those of the model as exported."""
    import onnx

    from memory_mcp.embedders.onnx import OnnxModel

    as_exported = OnnxModel(model_path(), max_tokens=256)
    streamlined = OnnxModel(model_path(), max_tokens=256, cache=tmp_path / "models")
    (copy,) = (tmp_path / "models").glob("*.onnx")
    nodes = len(onnx.load(str(copy), load_external_data=False).graph.node)
    assert nodes < 0.6 * len(onnx.load(str(model_path() / "model.onnx")).graph.node)
    for batch_size in (1, 2, 5):
        expected = as_exported.embed(TEXTS, batch_size=batch_size)
        assert streamlined.embed(TEXTS, batch_size=batch_size).tobytes() == expected.tobytes()
    assert streamlined.path == copy and as_exported.path == model_path() / "model.onnx"
    product = as_exported.embed(TEXTS, batch_size=real_embedder.batch_size)
    assert real_embedder._direct is not None
    assert real_embedder._direct.path.suffix == ".onnx"
    assert real_embedder._direct.path.parent.name == "models"  # the copy, not the export
    assert real_embedder.embed(TEXTS).tobytes() == product.tobytes()


def test_a_damaged_copy_is_dropped_and_the_model_runs_as_exported(tmp_path: Path) -> None:
    """A copy cut short (a crash while it was written elsewhere, a disk error) does not
    stop the model from loading; the next load makes it again."""
    from memory_mcp.embedders.graph import copy_path
    from memory_mcp.embedders.onnx import OnnxModel, model_file

    source = model_file(model_path())
    assert source is not None
    damaged = copy_path(source, tmp_path / "models")
    assert damaged is not None
    damaged.parent.mkdir()
    damaged.write_bytes(source.read_bytes()[:1000])
    loaded = OnnxModel(model_path(), max_tokens=256, cache=tmp_path / "models")
    assert not damaged.exists() and loaded.path == source
    expected = OnnxModel(model_path(), max_tokens=256).embed(TEXTS, batch_size=2)
    assert loaded.embed(TEXTS, batch_size=2).tobytes() == expected.tobytes()
    OnnxModel(model_path(), max_tokens=256, cache=tmp_path / "models")
    assert damaged.is_file()  # made again


def test_loading_the_model_from_its_folder_does_not_import_fastembed() -> None:
    script = (
        "import sys\n"
        "from memory_mcp.embedders.fastembed import FastEmbedEmbedder\n"
        f"e = FastEmbedEmbedder({MODEL_NAME!r}, model_path={str(model_path())!r})\n"
        "e.load()\n"
        "print(e.dim, 'fastembed' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["384", "False"]


def test_a_folder_fastembed_downloaded_to_is_remembered_for_the_next_start(
    tmp_path: Path,
) -> None:
    embedder = FastEmbedEmbedder(MODEL_NAME, cache_dir=str(tmp_path / "fastembed"))
    with pytest.raises(ModelNotLocal, match="not on this machine") as missing:
        embedder.locate()
    assert "embedder.model_path" in missing.value.hint
    # what _load_fastembed writes after fastembed found (or downloaded) the model
    known = {embedder._key(): str(model_path())}
    (tmp_path / "xdg-cache" / "memory-mcp").mkdir(parents=True, exist_ok=True)
    (tmp_path / "xdg-cache" / "memory-mcp" / FOLDERS_FILE).write_text(json.dumps(known))
    assert embedder.locate() == str(model_path())
    embedder.load()
    assert embedder._direct is not None and embedder.dim == 384


def test_a_model_folder_without_a_model_is_named_in_the_error(tmp_path: Path) -> None:
    embedder = FastEmbedEmbedder(MODEL_NAME, model_path=str(tmp_path))
    with pytest.raises(EmbedderError, match="holds no ONNX model"):
        embedder.locate()


def test_an_int8_copy_embeds_close_to_the_model_under_a_name_of_its_own(
    real_embedder: FastEmbedEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``embedder.quantize``: the model's int8 copy, made once in the cache folder; its
    vectors are near the model's but not the same, so they are named apart."""
    from memory_mcp.dirs import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    int8 = FastEmbedEmbedder(MODEL_NAME, model_path=str(model_path()), quantize=True)
    int8.load()
    assert int8.name == f"{real_embedder.name}:int8" and int8.dim == 384
    assert int8._direct is not None
    assert int8._direct.path.parent == tmp_path / "models"
    assert int8._direct.path.name.endswith(".int8.onnx")
    got, exact = int8.embed(TEXTS), real_embedder.embed(TEXTS)
    cosines = np.sum(got * exact, axis=1)
    assert float(cosines.min()) > 0.97, cosines
    assert float(np.abs(got - exact).max()) > 1e-3  # not the model's vectors
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    queries = int8.embed(["which platform do we deploy to", "what port does the API use"])
    assert [int(i) for i in np.argmax(queries @ got.T, axis=1)] == [0, 4]

    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("the copy was made again")

    monkeypatch.setattr(subprocess, "run", no_child)
    again = FastEmbedEmbedder(MODEL_NAME, model_path=str(model_path()), quantize=True)
    again.load()
    assert again._direct is not None and again._direct.path == int8._direct.path
    # a text's vector does not depend on the texts embedded with it
    assert again.embed(TEXTS[:1]).tobytes() == got[:1].tobytes()
    assert again.embed(TEXTS[::-1]).tobytes() == got[::-1].tobytes()


def test_an_int8_copy_that_cannot_be_made_is_an_error_not_the_model_as_exported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Vectors named int8 never come from the full model: a cache it cannot write (or a
    model it cannot quantize) fails the load with the reason, and it is tried again."""
    from memory_mcp.dirs import CACHE_ENV
    from memory_mcp.embedders import graph

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(graph, "_writable", lambda folder: False)
    embedder = FastEmbedEmbedder(MODEL_NAME, model_path=str(model_path()), quantize=True)
    with pytest.raises(EmbedderError, match=r"cannot make an int8 copy .*cannot write to"):
        embedder.load()
    assert embedder._direct is None and embedder._impl is None
    other = FastEmbedEmbedder("BAAI/bge-small-en-v1.5", model_path=str(model_path()), quantize=True)
    with pytest.raises(EmbedderError, match="quantize runs sentence-transformers/all-MiniLM"):
        other.load()


def test_a_damaged_int8_copy_is_dropped_and_made_again_at_the_next_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unlike a damaged streamlined copy, a damaged int8 copy cannot fall back to the
    model as exported (its vectors would carry the int8 name): the load fails, the
    copy goes, and the next load makes it again."""
    from memory_mcp.dirs import CACHE_ENV
    from memory_mcp.embedders.graph import INT8, copy_path
    from memory_mcp.embedders.onnx import model_file

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    source = model_file(model_path())
    assert source is not None
    damaged = copy_path(source, tmp_path / "models", kind=INT8)
    assert damaged is not None and damaged.name.endswith(".int8.onnx")
    damaged.parent.mkdir()
    damaged.write_bytes(source.read_bytes()[:1000])
    embedder = FastEmbedEmbedder(MODEL_NAME, model_path=str(model_path()), quantize=True)
    with pytest.raises(EmbedderError, match="cannot load"):
        embedder.load()
    assert not damaged.exists() and embedder._direct is None
    again = FastEmbedEmbedder(MODEL_NAME, model_path=str(model_path()), quantize=True)
    again.load()
    assert again._direct is not None and again._direct.path == damaged and damaged.is_file()


def test_quantize_makes_the_int8_copy_from_the_folder_fastembed_fetched_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model not yet on the machine: fastembed fetches it, and the copy is made from
    the folder it says it used, even when that folder could not be remembered."""
    from types import SimpleNamespace

    from memory_mcp.dirs import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    embedder = FastEmbedEmbedder(MODEL_NAME, cache_dir=str(tmp_path / "fastembed"), quantize=True)
    fetched = SimpleNamespace(model=SimpleNamespace(_model_dir=str(model_path())))
    asked: list[bool] = []

    def fetch(folder: Path | None, *, download: bool) -> SimpleNamespace:
        asked.append(download)
        return fetched  # as fastembed's, its folder not written to the remembered ones

    monkeypatch.setattr(embedder, "_load_fastembed", fetch)
    embedder.load(download=True)
    assert asked == [True]
    assert embedder._direct is not None and embedder._impl is None
    assert embedder._direct.path.name.endswith(".int8.onnx") and embedder.dim == 384
