"""The KernelBackend registry: shipped providers, unknown names, third-party entry points."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import textwrap
import types

import pytest

import pagekernels
from pagekernels import KernelBackend, ModuleBackend, available_backends, get_backend

OPS = [
    "paged_attention",
    "write_kv",
    "gather_kv",
    "dense_attention",
    "quantized_embedding",
    "linear",
    "split_linear",
    "add_rms_norm",
    "norm_rope",
    "decoder_layer",
]


@pytest.mark.parametrize("name", ["native", "reference"])
def test_shipped_backends_are_found_by_name(name):
    backend = get_backend(name)
    module = importlib.import_module(f"pagekernels.{name}")
    assert isinstance(backend, ModuleBackend)
    assert backend.name == name
    assert name in available_backends()
    for op in OPS:  # the backend's ops are its module's functions
        assert getattr(backend, op) is getattr(module, op)


def test_module_backend_needs_every_op():
    partial = types.ModuleType("partial")
    partial.paged_attention = pagekernels.paged_attention
    with pytest.raises(AttributeError, match="write_kv"):
        ModuleBackend("partial", partial)


@pytest.mark.parametrize("name", ["native", "reference"])
@pytest.mark.parametrize("op", OPS)
def test_backends_implement_the_protocol_signatures(name, op):
    """Same parameters, kinds and defaults as KernelBackend (native adds only `stream`)."""
    expected = inspect.signature(getattr(KernelBackend, op)).parameters
    actual = dict(inspect.signature(getattr(get_backend(name), op)).parameters)
    actual.pop("stream", None)
    assert [p for p in expected if p != "self"] == list(actual)
    for param in actual.values():
        assert param.kind == expected[param.name].kind, param
        assert param.default == expected[param.name].default, param


def test_default_is_native():
    assert get_backend().name == "native"


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(
        ValueError, match=r"unknown kernel backend 'metal'; available .*native, reference"
    ):
        get_backend("metal")


def test_a_third_provider_registers_through_an_entry_point(tmp_path, monkeypatch):
    (tmp_path / "thirdkernels.py").write_text(
        textwrap.dedent(
            """
            import sys

            from pagekernels import ModuleBackend
            from pagekernels.reference import (
                add_rms_norm, decoder_layer, dense_attention, gather_kv, linear, norm_rope,
                paged_attention, quantized_embedding, split_linear, write_kv,
            )

            backend = ModuleBackend("third", sys.modules[__name__])
            """
        )
    )
    dist_info = tmp_path / "thirdkernels-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdkernels\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(
        "[pagekernels.backends]\nthird = thirdkernels:backend\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()

    assert "third" in available_backends()
    backend = get_backend("third")
    assert backend.name == "third"
    assert backend.module.__name__ == "thirdkernels"


def test_public_api():
    assert sorted(pagekernels.__all__) == sorted(
        [*OPS, "DecoderLayerWeights", "KernelBackend", "ModuleBackend", "__version__",
         "available_backends", "get_backend", "validate_paged_metadata", "with_cuda"]
    )  # fmt: skip
    assert isinstance(pagekernels.with_cuda, bool)
    assert pagekernels.__version__ == importlib.metadata.version("pagekernels")


@pytest.mark.parametrize("module", ["backend", "native", "reference", "validation"])
def test_modules_declare_all(module):
    namespace = importlib.import_module(f"pagekernels.{module}")
    assert namespace.__all__, module
    for name in namespace.__all__:
        assert hasattr(namespace, name), (module, name)
