"""Loading and saving: Hugging Face directories (single, sharded, quantized), errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import huggingface_hub.constants
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from pagekernels import KernelBackend
from qwen3model import (
    SYNTHETIC_CONFIGS,
    ModelNotFoundError,
    QuantizationArgs,
    Qwen3Model,
    Tokenizer,
    build_synthetic,
    load_model,
    save_pretrained,
)
from qwen3model.projection import QuantizedStackedProjection

PROMPT = list(b"The quick brown fox jumps")


def assert_same_parameters(a: Qwen3Model, b: Qwen3Model) -> None:
    left, right = dict(tree_flatten(a.parameters())), dict(tree_flatten(b.parameters()))
    assert left.keys() == right.keys()
    for name, array in left.items():
        assert array.dtype == right[name].dtype, name
        assert mx.array_equal(array, right[name]).item(), name


def test_round_trip_gives_identical_logits(tiny, prefill, tmp_path: Path) -> None:
    model, tokenizer = tiny
    written = save_pretrained(model, tokenizer, tmp_path)
    assert [p.name for p in written] == ["model.safetensors"]
    assert {p.name for p in tmp_path.iterdir()} >= {"config.json", "tokenizer.json"}
    loaded, loaded_tokenizer = load_model(str(tmp_path))
    assert loaded.args == model.args
    assert_same_parameters(model, loaded)
    assert mx.array_equal(prefill(model, PROMPT), prefill(loaded, PROMPT)).item()
    assert loaded_tokenizer.encode("héllo") == tokenizer.encode("héllo")


def test_checkpoints_carry_hugging_face_names(tiny, tmp_path: Path) -> None:
    """Stacked projections are written as their parts (q_proj, k_proj, ...), row blocks of the
    stacked weight in order, and read back into the stack."""
    model, tokenizer = tiny
    save_pretrained(model, tokenizer, tmp_path)
    written = mx.load(str(tmp_path / "model.safetensors"))
    attn, mlp = "model.layers.1.self_attn.", "model.layers.1.mlp."
    names = [attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"]
    assert not any("qkv_proj" in name or "gate_up_proj" in name for name in written)
    stacked = model.model.layers[1].self_attn.qkv_proj.weight
    assert mx.array_equal(mx.concatenate([written[n] for n in names]), stacked).item()
    gate_up = model.model.layers[1].mlp.gate_up_proj.weight
    halves = [written[mlp + "gate_proj.weight"], written[mlp + "up_proj.weight"]]
    assert mx.array_equal(mx.concatenate(halves), gate_up).item()
    loaded, _ = load_model(str(tmp_path))
    assert_same_parameters(model, loaded)


def test_sharded_index_round_trip(tiny, prefill, tmp_path: Path) -> None:
    model, tokenizer = tiny
    written = save_pretrained(model, tokenizer, tmp_path, max_shard_bytes=40_000)
    shards = [p for p in written if p.suffix == ".safetensors"]
    assert len(shards) > 2
    assert shards[0].name == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    assert set(index["weight_map"]) == set(model.checkpoint_weights())
    loaded, _ = load_model(str(tmp_path))
    assert mx.array_equal(prefill(model, PROMPT), prefill(loaded, PROMPT)).item()


def test_bfloat16_round_trip_keeps_dtype(backend: KernelBackend, prefill, tmp_path: Path) -> None:
    model, tokenizer = load_model("synthetic:qwen3-tiny", kernel_backend=backend, dtype=mx.bfloat16)
    save_pretrained(model, tokenizer, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    loaded, _ = load_model(str(tmp_path), kernel_backend=backend)
    assert loaded.dtype == mx.bfloat16
    assert_same_parameters(model, loaded)
    assert mx.array_equal(prefill(model, PROMPT), prefill(loaded, PROMPT)).item()


def test_dtype_override_casts_float_weights(tiny, tmp_path: Path) -> None:
    save_pretrained(*tiny, tmp_path)
    loaded, _ = load_model(str(tmp_path), dtype=mx.float16)
    assert {a.dtype for _, a in tree_flatten(loaded.parameters())} == {mx.float16}


def test_4bit_round_trip_in_mlx_quantized_format(tiny, prefill, tmp_path: Path) -> None:
    model, tokenizer = tiny
    float_logits = prefill(model, PROMPT)
    model.quantize(QuantizationArgs(group_size=32, bits=4))
    quantized_logits = prefill(model, PROMPT)
    save_pretrained(model, tokenizer, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 4}
    loaded, _ = load_model(str(tmp_path))
    assert isinstance(loaded.model.embed_tokens, nn.QuantizedEmbedding)
    assert isinstance(loaded.model.layers[1].mlp.down_proj, nn.QuantizedLinear)
    qkv = loaded.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, QuantizedStackedProjection) and qkv.weight.dtype == mx.uint32
    assert list(qkv.parts) == ["q_proj", "k_proj", "v_proj"]
    assert_same_parameters(model, loaded)
    assert mx.array_equal(quantized_logits, prefill(loaded, PROMPT)).item()
    # 4 bits change the logits, but not beyond recognition.
    assert not mx.array_equal(quantized_logits, float_logits).item()
    assert np.corrcoef(np.array(quantized_logits), np.array(float_logits))[0, 1] > 0.9


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_embedding_kernel_matches_mlx_lookup(tiny, bits: int) -> None:
    model, _ = tiny
    model.quantize(QuantizationArgs(group_size=64, bits=bits))
    tokens = mx.array([[0, 5, 258], [17, 17, 200]], dtype=mx.int32)
    embedded = model.model.embed(tokens)
    expected = model.model.embed_tokens(tokens)  # MLX's own dequantizing lookup
    assert embedded.shape == expected.shape == (2, 3, 64)
    assert mx.allclose(embedded, expected, atol=1e-5, rtol=1e-5).item()


def test_untied_lm_head_round_trips(backend: KernelBackend, prefill, tmp_path: Path) -> None:
    args = dataclasses.replace(SYNTHETIC_CONFIGS["qwen3-tiny"], tie_word_embeddings=False)
    model = Qwen3Model(args, backend=backend)
    mx.eval(model.parameters())
    save_pretrained(model, Tokenizer.byte_level(), tmp_path)
    loaded, _ = load_model(str(tmp_path), kernel_backend=backend)
    assert "lm_head.weight" in dict(tree_flatten(loaded.parameters()))
    assert mx.array_equal(prefill(model, PROMPT), prefill(loaded, PROMPT)).item()


def test_tied_lm_head_in_checkpoint_is_dropped(tiny, prefill, tmp_path: Path) -> None:
    model, tokenizer = tiny
    save_pretrained(model, tokenizer, tmp_path)
    weights = mx.load(str(tmp_path / "model.safetensors"))
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = mx.ones((16,))
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    loaded, _ = load_model(str(tmp_path))
    assert mx.array_equal(prefill(model, PROMPT), prefill(loaded, PROMPT)).item()


def test_missing_directory_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match=str(missing)):
        load_model(str(missing))


def test_offline_hub_id_names_the_path_and_cache(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelNotFoundError, match="not found: no directory at") as error:
        load_model("nobody-here/no-such-model")
    assert str(tmp_path / "nobody-here" / "no-such-model") in str(error.value)


@pytest.mark.parametrize(
    ("break_it", "error", "match"),
    [
        (lambda d: (d / "config.json").unlink(), ModelNotFoundError, "no config.json"),
        (lambda d: (d / "model.safetensors").unlink(), FileNotFoundError, "no \\*.safetensors"),
        (lambda d: (d / "tokenizer.json").unlink(), FileNotFoundError, "tokenizer.json"),
    ],
    ids=["no-config", "no-weights", "no-tokenizer"],
)
def test_incomplete_directory_is_a_clear_error(tiny, tmp_path, break_it, error, match) -> None:
    save_pretrained(*tiny, tmp_path)
    break_it(tmp_path)
    with pytest.raises(error, match=match):
        load_model(str(tmp_path))


def test_pickled_weights_are_never_read(tiny, tmp_path: Path) -> None:
    save_pretrained(*tiny, tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(str(tmp_path))


def test_missing_shard_is_named(tiny, tmp_path: Path) -> None:
    written = save_pretrained(*tiny, tmp_path, max_shard_bytes=40_000)
    written[1].unlink()
    with pytest.raises(FileNotFoundError, match=written[1].name):
        load_model(str(tmp_path))


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda w: w.pop("model.norm.weight"), "missing \\['model.norm.weight'\\]"),
        (lambda w: w.update(extra=mx.ones((2,))), "unexpected \\['extra'\\]"),
        (
            lambda w: w.pop("model.layers.0.self_attn.v_proj.weight"),
            "checkpoint has .*k_proj.weight'\\] but not \\['model.layers.0.self_attn.v_proj",
        ),
        (
            lambda w: w.update(
                {"model.layers.1.mlp.up_proj.weight": w["model.layers.1.mlp.up_proj.weight"][:-1]}
            ),
            "checkpoint model.layers.1.mlp.up_proj.weight has 127 rows, expected 128",
        ),
        (
            lambda w: w.update({"model.norm.weight": w["model.norm.weight"].astype(mx.bfloat16)}),
            "mixes float dtypes \\['bfloat16', 'float32'\\]",
        ),
        (
            lambda w: w.update({"model.norm.weight": w["model.norm.weight"].astype(mx.int32)}),
            "wrong kind: \\['model.norm.weight \\(int32, expected float32\\)'\\]",
        ),
    ],
    ids=[
        "missing-tensor",
        "extra-tensor",
        "missing-stacked-part",
        "stacked-part-rows",
        "mixed-float-dtypes",
        "integer-norm",
    ],
)
def test_weights_that_do_not_fit_the_config(tiny, tmp_path: Path, edit, match) -> None:
    save_pretrained(*tiny, tmp_path)
    weights = mx.load(str(tmp_path / "model.safetensors"))
    edit(weights)
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    with pytest.raises(ValueError, match=match):
        load_model(str(tmp_path))


def test_mixed_dtypes_load_with_an_explicit_dtype(tiny, tmp_path: Path) -> None:
    save_pretrained(*tiny, tmp_path)
    weights = mx.load(str(tmp_path / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"].astype(mx.bfloat16)
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    loaded, _ = load_model(str(tmp_path), dtype=mx.float32)
    assert {a.dtype for _, a in tree_flatten(loaded.parameters())} == {mx.float32}


@pytest.mark.parametrize("first_shard_bytes", [40_000, None], ids=["sharded-first", "single-first"])
def test_saving_again_replaces_the_earlier_weights(
    backend: KernelBackend, prefill, tmp_path: Path, first_shard_bytes: int | None
) -> None:
    """A second save into the same directory, sharded or not, is what loads: no stale index
    or shard of the first save is read."""
    first, tokenizer = build_synthetic("qwen3-tiny", backend=backend, dtype=mx.float32, seed=1)
    second, _ = build_synthetic("qwen3-tiny", backend=backend, dtype=mx.float32, seed=2)
    save_pretrained(first, tokenizer, tmp_path, max_shard_bytes=first_shard_bytes)
    other_bytes = None if first_shard_bytes else 40_000
    written = save_pretrained(second, tokenizer, tmp_path, max_shard_bytes=other_bytes)
    weight_files = {p.name for p in tmp_path.iterdir() if p.name.startswith("model")}
    assert weight_files == {p.name for p in written}
    loaded, _ = load_model(str(tmp_path))
    assert_same_parameters(second, loaded)


def test_unknown_synthetic_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="synthetic:qwen3-tiny"):
        load_model("synthetic:qwen3-huge")
