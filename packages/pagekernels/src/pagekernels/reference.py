"""The readable `mlx.core` equation of every op (the `reference` backend and the tests' oracle).

Same signatures and semantics as `pagekernels.native` (shape letters as in `pagekernels`),
written for clarity, not speed: paged attention gathers K/V through the block table with MLX
indexing and runs masked float32 softmax attention on the dense result. Like the native ops,
these never read array values on the host, so they run inside `mx.compile` and cost no device
sync per layer. `TOLERANCE` is how close another implementation must come to them.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from typing import Literal

import mlx.core as mx

from pagekernels.backend import DecoderLayerWeights, ModuleBackend

__all__ = [
    "DECODER_LAYER_TOLERANCE",
    "NORM_ROPE_TOLERANCE",
    "TOLERANCE",
    "add_rms_norm",
    "backend",
    "decoder_layer",
    "dense_attention",
    "gather_kv",
    "linear",
    "norm_rope",
    "paged_attention",
    "quantized_embedding",
    "split_linear",
    "write_kv",
]

#: The oracle tolerances: an implementation matches these equations when its output, in the
#: output dtype, is within this absolute and relative tolerance of theirs (scores and softmax
#: run in float32 either way; float16/bfloat16 differ by their rounding of inputs and outputs).
TOLERANCE: dict[mx.Dtype, float] = {mx.float32: 1e-5, mx.float16: 2e-2, mx.bfloat16: 2e-2}

#: How close `native.norm_rope` comes to `norm_rope` below evaluated in the input dtype. The
#: kernels keep the normed value, cos/sin and the rotation in float32 and round once; in
#: float16/bfloat16 this composition rounds the normed value, its product with the weight, cos
#: and sin, both products and their sum. In bfloat16 that puts it up to ~0.05 from the exact
#: result (normed values up to ~4.5; measured over 2M elements), hence 4e-2 there; evaluated in
#: float32 and rounded once it matches the kernels within `TOLERANCE`. Float32 matches at 1e-5
#: at positions of 32k too: the kernels take the frequencies of MLX's CPU rope and round the
#: angle as it does (run on a GPU stream, MLX's CUDA rope computes its frequencies otherwise and
#: can differ from the CPU result by ~1e-3 there: compare on the CPU stream).
NORM_ROPE_TOLERANCE: dict[mx.Dtype, float] = {**TOLERANCE, mx.bfloat16: 4e-2}

#: How close a `decoder_layer` in a dtype must come to `decoder_layer` below evaluated in
#: float32 on the same inputs (upcast): `max |actual - exact| <= tol * max |exact|` per output.
#: A layer rounds four projections' inputs and outputs to the dtype, and their errors compound
#: elementwise (a small output element can be off by many of its own ulps), so the bound is
#: relative to the output's scale. This module's own composition in bfloat16 measures up to
#: 1.1e-2 by it, in float16 9e-4 (qwen3-like widths, random weights).
DECODER_LAYER_TOLERANCE: dict[mx.Dtype, float] = {
    mx.float32: 1e-5,
    mx.float16: 4e-3,
    mx.bfloat16: 2e-2,
}


def _mapped_pages(block_table: mx.array, num_pages: int) -> mx.array:
    """`[B, max_pages]`: whether each page entry names a stored page."""
    return (block_table >= 0) & (block_table < num_pages)


def _mapped_keys(block_table: mx.array, num_pages: int, page_size: int) -> mx.array:
    """`[B, max_pages * page_size]`: whether each logical key's page entry names a stored page."""
    return mx.repeat(_mapped_pages(block_table, num_pages), page_size, axis=1)


def gather_kv(
    key_pages: mx.array,
    value_pages: mx.array,
    block_table: mx.array,
    context_lens: mx.array,
    page_size: int,
) -> tuple[mx.array, mx.array]:
    """Dense K/V of each row's pages; see `pagekernels.native.gather_kv`.

    Returns:
        `(keys, values)`, each `[B, Hkv, max_pages * page_size, D]`, zeros past the context.
    """
    P, Hkv, _, D = key_pages.shape
    B, max_pages = block_table.shape
    positions = mx.arange(max_pages * page_size)
    live = _mapped_keys(block_table, P, page_size) & (positions[None, :] < context_lens[:, None])
    page_ids = mx.where(_mapped_pages(block_table, P), block_table, 0)

    def dense(pages: mx.array) -> mx.array:
        rows = pages[page_ids]  # [B, max_pages, Hkv, ps, D]
        rows = rows.transpose(0, 2, 1, 3, 4).reshape(B, Hkv, max_pages * page_size, D)
        return mx.where(live[:, None, :, None], rows, mx.zeros_like(rows))

    return dense(key_pages), dense(value_pages)


def dense_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    *,
    scale: float | None = None,
    mask: Literal["causal"] | None = None,
    key_lens: mx.array | None = None,
) -> mx.array:
    """softmax(q k^T * scale, masked) v in float32; see `pagekernels.native.dense_attention`.

    Returns:
        `[B, Hq, L, D]` in the queries' dtype; rows that see no key are zeros.
    """
    return _attention(queries, keys, values, scale=scale, mask=mask, key_lens=key_lens)


def _attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    *,
    scale: float | None,
    mask: Literal["causal"] | None,
    key_lens: mx.array | None,
    key_mask: mx.array | None = None,
) -> mx.array:
    """`dense_attention`, where keys with `key_mask[b, s]` False (`[B, S]`) are not seen either."""
    if mask not in (None, "causal"):  # as the kernels: anything else would read as no mask
        raise ValueError(f'mask must be None or "causal", got {mask!r}')
    B, Hq, L, D = queries.shape
    _, Hkv, S, _ = keys.shape
    scale = D**-0.5 if scale is None else scale
    lens = mx.full((B,), S, dtype=mx.int32) if key_lens is None else mx.clip(key_lens, 0, S)

    key_pos = mx.arange(S)[None, :]  # [1, S]
    query_pos = mx.arange(L)[:, None]  # [L, 1]
    row_lens = lens[:, None, None]  # [B, 1, 1]
    visible = key_pos[None] < row_lens  # [B, 1, S]
    if key_mask is not None:
        visible = visible & key_mask[:, None, :]

    # Keys past key_lens are not part of the row (whatever the buffer holds there).
    live = visible[:, :, :, None]  # [B, 1, S, 1]
    k = mx.where(live, keys.astype(mx.float32), 0.0)[:, :, None]  # [B, Hkv, 1, S, D]
    v = mx.where(live, values.astype(mx.float32), 0.0)[:, :, None]
    # Grouped-query attention: the G = Hq / Hkv query heads of kv head h are heads h*G..h*G+G-1.
    q = queries.astype(mx.float32).reshape(B, Hkv, Hq // Hkv, L, D)
    scores = (q * scale) @ k.swapaxes(-1, -2)  # [B, Hkv, G, L, S]

    if mask == "causal":  # bottom-right aligned: the last query sees every key of its row
        visible = visible & (key_pos[None] <= query_pos[None] + row_lens - L)  # [B, L, S]
    visible = visible[:, None, None]  # [B, 1, 1, L or 1, S]

    weights = mx.softmax(mx.where(visible, scores, -mx.inf), axis=-1)
    weights = mx.where(visible, weights, 0.0)  # rows with no visible key: zeros, not NaN
    out = weights @ v  # [B, Hkv, G, L, D]
    return out.reshape(B, Hq, L, D).astype(queries.dtype)


def paged_attention(
    queries: mx.array,
    key_pages: mx.array,
    value_pages: mx.array,
    block_table: mx.array,
    context_lens: mx.array,
    page_size: int,
    *,
    scale: float | None = None,
    mask: Literal["causal"] | None = None,
) -> mx.array:
    """Gather through the block table, then dense attention; see
    `pagekernels.native.paged_attention`.

    Returns:
        `[B, Hq, L, D]` in the queries' dtype.
    """
    keys, values = gather_kv(key_pages, value_pages, block_table, context_lens, page_size)
    # A key whose page entry is -1 or out of storage (out of contract below context_lens) is
    # not seen, as in the kernels, rather than seen as a zero key.
    mapped = _mapped_keys(block_table, key_pages.shape[0], page_size)
    return _attention(
        queries, keys, values, scale=scale, mask=mask, key_lens=context_lens, key_mask=mapped
    )


def write_kv(
    key_pages: mx.array,
    value_pages: mx.array,
    keys: mx.array,
    values: mx.array,
    slot_mapping: mx.array,
) -> tuple[mx.array, mx.array]:
    """Pages with token t's K/V at slot `slot_mapping[t]`; see `pagekernels.native.write_kv`.

    Functional: returns new arrays and leaves the inputs untouched. Negative and out-of-storage
    slots are sent to a scratch page appended past the storage and dropped with it, so the
    write needs no host-side filtering (no sync; works inside `mx.compile`).

    Returns:
        `(key_pages, value_pages)`, each `[P, Hkv, page_size, D]`.
    """
    P, _, page_size, _ = key_pages.shape
    valid = (slot_mapping >= 0) & (slot_mapping < P * page_size)  # [T]
    pages = mx.where(valid, slot_mapping // page_size, P)  # P: the scratch page
    offsets = mx.where(valid, slot_mapping % page_size, 0)

    def write(storage: mx.array, rows: mx.array) -> mx.array:
        scratch = mx.zeros((1, *storage.shape[1:]), dtype=storage.dtype)
        padded = mx.concatenate([storage, scratch])  # [P + 1, Hkv, page_size, D]
        padded[pages, :, offsets] = rows  # [T, Hkv, D] at (page, :, offset)
        return padded[:P]

    return write(key_pages, keys), write(value_pages, values)


def quantized_embedding(
    indices: mx.array,
    weight: mx.array,
    scales: mx.array,
    biases: mx.array,
    *,
    group_size: int,
    bits: int,
) -> mx.array:
    """`mx.dequantize` of the selected rows, zeros for out-of-range indices; see
    `pagekernels.native.quantized_embedding`.

    Returns:
        `[..., dims]` in the scales' dtype.
    """
    valid = (indices >= 0) & (indices < weight.shape[0])
    rows = mx.where(valid, indices, 0)
    table = mx.dequantize(
        weight[rows], scales[rows], biases[rows], group_size=group_size, bits=bits
    )
    return mx.where(valid[..., None], table, 0.0).astype(scales.dtype)


def linear(x: mx.array, weight: mx.array) -> mx.array:
    """`x @ weight.T`; see `pagekernels.native.linear`.

    Args:
        x: `[..., K]` float.
        weight: `[N, K]` float.

    Returns:
        `[..., N]`, the promoted dtype of x and weight.
    """
    return x @ weight.T


def split_linear(x: mx.array, weight: mx.array, widths: Sequence[int]) -> list[mx.array]:
    """`x @ weight.T` split along the last axis into parts of `widths`; see
    `pagekernels.native.split_linear`.

    Args:
        x: `[..., K]` float.
        weight: `[N, K]` float.
        widths: Part widths summing to N.

    Returns:
        One `[..., widths[i]]` array per part.

    Raises:
        ValueError: The widths are negative or do not sum to N (`mx.split` would give other
            parts without a word).
    """
    if any(w < 0 for w in widths) or sum(widths) != weight.shape[0]:
        raise ValueError(
            f"widths must be non-negative output widths summing to weight.shape[0]="
            f"{weight.shape[0]} (N), got {list(widths)}"
        )
    boundaries = list(itertools.accumulate(widths))[:-1]
    return mx.split(x @ weight.T, boundaries, axis=-1)


def add_rms_norm(
    residual: mx.array, update: mx.array, weight: mx.array, *, eps: float
) -> tuple[mx.array, mx.array]:
    """`(residual + update, mx.fast.rms_norm(residual + update, weight, eps))`; see
    `pagekernels.native.add_rms_norm`.

    Args:
        residual: `[..., H]` float.
        update: `[..., H]`, residual's dtype.
        weight: `[H]`, residual's dtype.
        eps: Positive.

    Returns:
        `(sum, normed)`, each `[..., H]`.
    """
    total = residual + update
    return total, mx.fast.rms_norm(total, weight, eps)


def norm_rope(
    x: mx.array, weight: mx.array, offsets: mx.array, *, eps: float, base: float
) -> mx.array:
    """`mx.fast.rms_norm`, then non-traditional `mx.fast.rope` at positions `offsets[b] + l`;
    see `pagekernels.native.norm_rope`.

    Args:
        x: `[B, L, H, D]` float.
        weight: `[D]`, x's dtype.
        offsets: int32 `[B]`.
        eps: The norm's epsilon.
        base: The RoPE base.

    Returns:
        `[B, H, L, D]` in x's dtype.
    """
    D = x.shape[-1]
    normed = mx.fast.rms_norm(x, weight, eps)
    return mx.fast.rope(
        normed.transpose(0, 2, 1, 3), D, traditional=False, base=base, scale=1.0, offset=offsets
    )


def decoder_layer(
    residual: mx.array,
    pending: mx.array | None,
    weights: DecoderLayerWeights,
    key_pages: mx.array,
    value_pages: mx.array,
    block_table: mx.array,
    context_lens: mx.array,
    slot_mapping: mx.array,
    offsets: mx.array,
    page_size: int,
    *,
    eps: float,
    rope_base: float,
    scale: float | None = None,
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """One pre-norm Qwen3 decoder layer over paged K/V, composed of this module's ops; see
    `pagekernels.native.decoder_layer`.

    Args:
        residual: `[B, L, H]` float.
        pending: `[B, L, H]` or None.
        weights: The layer's weights.
        key_pages: `[P, Hkv, page_size, D]`.
        value_pages: `[P, Hkv, page_size, D]`.
        block_table: int32 `[B, max_pages]`.
        context_lens: int32 `[B]`.
        slot_mapping: int32 `[B * L]`.
        offsets: int32 `[B]`.
        page_size: Tokens per page.
        eps: The norms' epsilon.
        rope_base: The RoPE base.
        scale: Softmax scale; None means `D ** -0.5`.

    Returns:
        `(h, mlp, key_pages, value_pages)`.
    """
    B, L, _ = residual.shape
    _, Hkv, _, D = key_pages.shape
    Hq = weights.qkv_proj.shape[0] // D - 2 * Hkv
    h = residual if pending is None else residual + pending
    x = mx.fast.rms_norm(h, weights.input_layernorm, eps)
    q, k, v = split_linear(x, weights.qkv_proj, [Hq * D, Hkv * D, Hkv * D])
    q = norm_rope(q.reshape(B, L, Hq, D), weights.q_norm, offsets, eps=eps, base=rope_base)
    k = norm_rope(k.reshape(B, L, Hkv, D), weights.k_norm, offsets, eps=eps, base=rope_base)
    key_pages, value_pages = write_kv(
        key_pages,
        value_pages,
        k.transpose(0, 2, 1, 3).reshape(B * L, Hkv, D),
        v.reshape(B * L, Hkv, D),
        slot_mapping,
    )
    attended = paged_attention(
        q, key_pages, value_pages, block_table, context_lens, page_size, scale=scale, mask="causal"
    )
    h = h + linear(attended.transpose(0, 2, 1, 3).reshape(B, L, Hq * D), weights.o_proj)
    x = mx.fast.rms_norm(h, weights.post_attention_layernorm, eps)
    gate, up = split_linear(x, weights.gate_up_proj, [weights.gate_up_proj.shape[0] // 2] * 2)
    mlp = linear(gate * mx.sigmoid(gate) * up, weights.down_proj)
    return h, mlp, key_pages, value_pages


#: The `reference` entry point of the `pagekernels.backends` group.
backend = ModuleBackend("reference", sys.modules[__name__])
