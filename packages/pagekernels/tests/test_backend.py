"""The KernelBackend registry: shipped providers, unknown names, third-party entry points."""

from __future__ import annotations

import importlib
import inspect
import textwrap

import pytest

import pagekernels
from pagekernels import KernelBackend, available_backends, get_backend
from pagekernels.native import NativeBackend
from pagekernels.reference import ReferenceBackend

OPS = ["paged_attention", "write_kv", "gather_kv", "dense_attention", "quantized_embedding"]


@pytest.mark.parametrize(
    ("name", "cls"), [("native", NativeBackend), ("reference", ReferenceBackend)], ids=str
)
def test_shipped_backends_are_found_by_name(name, cls):
    backend = get_backend(name)
    assert isinstance(backend, cls)
    assert backend.name == name
    assert name in available_backends()


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
            from pagekernels.reference import ReferenceBackend

            class ThirdBackend(ReferenceBackend):
                name = "third"

            backend = ThirdBackend()
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
    assert type(backend).__module__ == "thirdkernels"


def test_public_api():
    assert sorted(pagekernels.__all__) == sorted(
        [*OPS, "KernelBackend", "available_backends", "get_backend", "validate_paged_metadata",
         "with_cuda"]
    )  # fmt: skip
    assert isinstance(pagekernels.with_cuda, bool)
