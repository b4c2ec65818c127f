"""The compiled kernels: typed wrappers over the `_ext` custom primitives (the `native` backend).

Shape letters as in `pagekernels`. Every op is lazy like any MLX op and checks ranks, shapes
and dtypes (ValueError); it never reads array values, so per-step metadata values are checked
on the host (`validate_paged_metadata`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Literal

import mlx.core as mx

from pagekernels import _ext
from pagekernels.backend import DecoderLayerWeights, ModuleBackend

__all__ = [
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
    "with_cuda",
    "write_kv",
]

StreamOrDevice = mx.Stream | mx.Device | None

#: True when this build carries the CUDA kernels (built with PAGEKERNELS_CUDA=1). A fact of
#: the compiled `_ext`, fixed at build time: a plain bool, not a function or a setting.
with_cuda: bool = _ext.with_cuda


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
    stream: StreamOrDevice = None,
) -> mx.array:
    """Attention over K/V read straight from page storage through a block table.

    Request b's logical key t lives in page `block_table[b, t // page_size]`, slot
    `t % page_size`; it has `context_lens[b]` keys. Query head h reads kv head
    `h // (Hq // Hkv)`. Scores and softmax run in float32. Queries with L <= 8 use the decode
    schedule, longer ones the prefill schedule (chosen inside the extension).

    Args:
        queries: `[B, Hq, L, D]` float32, float16 or bfloat16.
        key_pages: `[P, Hkv, page_size, D]`, the queries' dtype.
        value_pages: `[P, Hkv, page_size, D]`, the queries' dtype.
        block_table: int32 `[B, max_pages]`, physical page ids, -1 for unused entries. An entry
            inside the context that is -1 or past the storage (out of contract: pagepool never
            writes one) hides its keys: they are not attended to.
        context_lens: int32 `[B]`, keys per row (including the L new ones); 0 for an empty row.
        page_size: Tokens per page; must equal `key_pages.shape[2]`.
        scale: Score scale; None means `D ** -0.5`.
        mask: None (every row sees all its keys) or "causal": query l of row b sees key s iff
            `s <= l + context_lens[b] - L` (bottom-right aligned).
        stream: Stream or device to run on (default: the default stream).

    Returns:
        `[B, Hq, L, D]` in the queries' dtype; rows that see no key are zeros.

    Raises:
        ValueError: On wrong ranks, shapes or dtypes, `Hq % Hkv != 0`, a page size that is not
            positive or differs from `key_pages.shape[2]`, or a mask other than None/"causal".
    """
    return _ext.paged_attention(
        queries,
        key_pages,
        value_pages,
        block_table,
        context_lens,
        page_size,
        scale=scale,
        mask=mask,
        stream=stream,
    )


def write_kv(
    key_pages: mx.array,
    value_pages: mx.array,
    keys: mx.array,
    values: mx.array,
    slot_mapping: mx.array,
    *,
    stream: StreamOrDevice = None,
) -> tuple[mx.array, mx.array]:
    """Writes new tokens' K/V into their page slots, in place (cost proportional to T).

    Token t goes to slot `slot_mapping[t] = page_id * page_size + offset`. Negative slots
    (padding) and slots beyond the storage are skipped. The returned arrays share the input
    pages' buffers: use them in place of the inputs, so that later reads depend on the write.

    Args:
        key_pages: `[P, Hkv, page_size, D]` float32, float16 or bfloat16 (row-contiguous, as
            pagepool allocates it; a strided view would be copied first).
        value_pages: `[P, Hkv, page_size, D]`, same dtype.
        keys: `[T, Hkv, D]`, the pages' dtype.
        values: `[T, Hkv, D]`, the pages' dtype.
        slot_mapping: int32 `[T]`.
        stream: Stream or device to run on.

    Returns:
        `(key_pages, value_pages)`, each `[P, Hkv, page_size, D]`, holding the new tokens.

    Raises:
        ValueError: On wrong ranks, shapes or dtypes.
    """
    return _ext.write_kv(key_pages, value_pages, keys, values, slot_mapping, stream=stream)


def gather_kv(
    key_pages: mx.array,
    value_pages: mx.array,
    block_table: mx.array,
    context_lens: mx.array,
    page_size: int,
    *,
    stream: StreamOrDevice = None,
) -> tuple[mx.array, mx.array]:
    """Copies each row's pages into dense K/V (the dense-gather ablation).

    Args:
        key_pages: `[P, Hkv, page_size, D]` float32, float16 or bfloat16.
        value_pages: `[P, Hkv, page_size, D]`, same dtype.
        block_table: int32 `[B, max_pages]`, -1 for unused entries.
        context_lens: int32 `[B]`.
        page_size: Tokens per page; must equal `key_pages.shape[2]`.
        stream: Stream or device to run on.

    Returns:
        `(keys, values)`, each `[B, Hkv, max_pages * page_size, D]` in the pages' dtype, zeros
        past `context_lens[b]`.

    Raises:
        ValueError: On wrong ranks, shapes or dtypes, or a bad page size.
    """
    return _ext.gather_kv(
        key_pages, value_pages, block_table, context_lens, page_size, stream=stream
    )


def dense_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    *,
    scale: float | None = None,
    mask: Literal["causal"] | None = None,
    key_lens: mx.array | None = None,
    stream: StreamOrDevice = None,
) -> mx.array:
    """Attention over dense K/V with the same online-softmax kernel as `paged_attention`.

    Args:
        queries: `[B, Hq, L, D]` float32, float16 or bfloat16.
        keys: `[B, Hkv, S, D]`, the queries' dtype.
        values: `[B, Hkv, S, D]`, the queries' dtype.
        scale: Score scale; None means `D ** -0.5`.
        mask: None or "causal", aligned to `key_lens[b]` (query l sees key s iff
            `s <= l + key_lens[b] - L`).
        key_lens: int32 `[B]`, valid keys per row (the first `key_lens[b]` of S); None means S.
        stream: Stream or device to run on.

    Returns:
        `[B, Hq, L, D]` in the queries' dtype; rows that see no key are zeros.

    Raises:
        ValueError: On wrong ranks, shapes or dtypes, `Hq % Hkv != 0` or a bad mask.
    """
    return _ext.dense_attention(
        queries, keys, values, scale=scale, mask=mask, key_lens=key_lens, stream=stream
    )


def quantized_embedding(
    indices: mx.array,
    weight: mx.array,
    scales: mx.array,
    biases: mx.array,
    *,
    group_size: int,
    bits: int,
    stream: StreamOrDevice = None,
) -> mx.array:
    """Looks up rows of an `mx.quantize`d table in one dispatch (affine mode).

    Equal to `mx.dequantize(weight[indices], scales[indices], biases[indices], ...)` for valid
    indices; an index outside `[0, V)` gives a row of zeros (never a read outside the table).

    Args:
        indices: Any integer dtype, any shape `[...]`.
        weight: uint32 `[V, dims * bits / 32]`, packed as `mx.quantize` packs it.
        scales: `[V, dims / group_size]` float32, float16 or bfloat16.
        biases: `[V, dims / group_size]`, the scales' dtype.
        group_size: 32, 64 or 128.
        bits: 1, 2, 3, 4, 5, 6 or 8.
        stream: Stream or device to run on.

    Returns:
        `[..., dims]` in the scales' dtype.

    Raises:
        ValueError: On a non-integer index dtype, unsupported bits or group size, or shapes
            that do not fit together.
    """
    return _ext.quantized_embedding(
        indices, weight, scales, biases, group_size=group_size, bits=bits, stream=stream
    )


def linear(x: mx.array, weight: mx.array, *, stream: StreamOrDevice = None) -> mx.array:
    """`x @ weight.T` for the projections of a decode step.

    On a GPU stream, x and weight both float16 or both bfloat16 with at most
    `_ext.linear_max_rows` (16) rows and `K % 64 == 0` run one kernel node that reads each
    weight byte once (MLX would take cuBLASLt, whose per-call host cost exceeds the weights'
    streaming time at these sizes); everything else is `mx.matmul`, dtypes promoting as there.
    `_ext.linear(..., use_kernel=True/False)` forces our kernel or matmul (tests, benchmarks).

    Args:
        x: `[..., K]` float32, float16 or bfloat16.
        weight: `[N, K]` float (the layout of `mlx.nn.Linear.weight`).
        stream: Stream or device to run on.

    Returns:
        `[..., N]`, the promoted dtype of x and weight (x's when they agree).

    Raises:
        ValueError: On ranks, non-float dtypes or a K that do not fit together.
    """
    return _ext.linear(x, weight, stream=stream)


def split_linear(
    x: mx.array, weight: mx.array, widths: Sequence[int], *, stream: StreamOrDevice = None
) -> list[mx.array]:
    """`x @ weight.T` split along its last axis, for weights stacked along N.

    A layer's projections that read the same input (q, k and v; gate and up) stack their
    weights into one `[N, K]` matrix; this returns the product's parts of `widths` as separate
    arrays. Where `linear` takes the kernel, this takes it too: one kernel streams every weight
    byte once and writes each part contiguous, so no slice or copy follows. Otherwise it is
    `mx.split(mx.matmul(...))`, whose parts are strided views.

    Args:
        x: `[..., K]` float32, float16 or bfloat16.
        weight: `[N, K]` float, the parts' weights stacked along N.
        widths: 1 to `_ext.linear_max_parts` (4) non-negative widths summing to N.
        stream: Stream or device to run on.

    Returns:
        One `[..., widths[i]]` array per part, dtype as `linear`.

    Raises:
        ValueError: As `linear`, or widths that do not sum to N.
    """
    return _ext.split_linear(x, weight, list(widths), stream=stream)


def add_rms_norm(
    residual: mx.array,
    update: mx.array,
    weight: mx.array,
    *,
    eps: float,
    stream: StreamOrDevice = None,
) -> tuple[mx.array, mx.array]:
    """A pre-norm block's residual step: `sum = residual + update` and its RMSNorm, one kernel.

    `normed = sum * rsqrt(mean(sum ** 2) + eps) * weight` over the last axis, computed in
    float32 from `sum` rounded to the dtype, so it equals `mx.fast.rms_norm(sum, weight, eps)`
    up to rounding. MLX would run the add and the norm as two kernels.

    Args:
        residual: `[..., H]` float32, float16 or bfloat16 (the residual stream).
        update: `[..., H]`, residual's dtype (a block's attention or MLP output).
        weight: `[H]`, residual's dtype.
        eps: Positive, finite.
        stream: Stream or device to run on.

    Returns:
        `(sum, normed)`, each `[..., H]` in residual's dtype.

    Raises:
        ValueError: On shapes or dtypes that do not fit together, or a bad eps.
    """
    return _ext.add_rms_norm(residual, update, weight, eps=eps, stream=stream)


def norm_rope(
    x: mx.array,
    weight: mx.array,
    offsets: mx.array,
    *,
    eps: float,
    base: float,
    stream: StreamOrDevice = None,
) -> mx.array:
    """RMSNorm then rotary position embedding of each head, fused (q_norm + RoPE of a layer).

    Per row `x[b, l, h]` of D elements: `n = x / sqrt(mean(x**2) + eps) * weight`, then
    each pair `(n[i], n[i + D/2])` (non-traditional RoPE) rotated by the angle
    `(offsets[b] + l) * base ** (-2i / D)`; the result is transposed to heads first. Equal to
    `mx.fast.rope(mx.fast.rms_norm(x, weight, eps).transpose(0, 2, 1, 3), D, ...,
    offset=offsets)` (`pagekernels.reference.norm_rope`), but one kernel reading and writing
    each element once, in float32 throughout (see `reference.NORM_ROPE_TOLERANCE`).

    Args:
        x: `[B, L, H, D]` float32, float16 or bfloat16; any strides (e.g. a reshaped column
            slice of a fused QKV projection), read without a copy. D even; on a GPU stream
            the kernel takes `D % 64 == 0` up to 256, other D run `mx.fast.rms_norm` and
            `mx.fast.rope`.
        weight: `[D]`, x's dtype (the norm's scale).
        offsets: int32 `[B]`, the position of each row's first token.
        eps: The norm's epsilon, finite and positive.
        base: The RoPE base (`rope_theta`), finite and positive.
        stream: Stream or device to run on.

    Returns:
        `[B, H, L, D]` in x's dtype, row-contiguous.

    Raises:
        ValueError: On wrong ranks, shapes or dtypes, an odd D, or an eps or base that is not
            finite and positive.
    """
    return _ext.norm_rope(x, weight, offsets, eps=eps, base=base, stream=stream)


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
    stream: StreamOrDevice = None,
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """One pre-norm Qwen3 decoder layer over paged K/V, as one graph node for a decode step.

    The equation (`pagekernels.reference.decoder_layer`)::

        h = residual + pending;  x = rms_norm(h) * input_layernorm
        q, k, v = split(x @ qkv_proj.T);  q, k = norm_rope(q), norm_rope(k)
        pages = write_kv(pages, k, v, slot_mapping)
        h = h + paged_attention(q, pages, mask="causal") @ o_proj.T
        gate, up = split(rms_norm(h) * post_attention_layernorm @ gate_up_proj.T)
        mlp = (silu(gate) * up) @ down_proj.T

    MLX spends host time on every graph operation (about 5 us with a kernel), and a layer
    built from the separate ops is a dozen of them plus views. On a GPU stream a decode step
    (L = 1, float16/bfloat16, B <= 16, H, I and Hq*D multiples of 64, H <= 8192, D a
    `norm_rope` kernel head dim) is one `DecoderLayer` node that adds the same kernels to the
    graph itself; SwiGLU's `silu(gate) * up` runs in float32 with one rounding there. Anything
    else composes the other native ops.

    Args:
        residual: `[B, L, H]` float32, float16 or bfloat16: the residual stream.
        pending: The previous layer's MLP output `[B, L, H]` (residual's dtype), or None for
            the first layer.
        weights: The layer's weights (`DecoderLayerWeights`), residual's dtype. Hkv and D come
            from the pages, Hq from `qkv_proj`'s rows.
        key_pages: `[P, Hkv, page_size, D]`, residual's dtype.
        value_pages: Same shape and dtype as `key_pages`.
        block_table: int32 `[B, max_pages]` (as for `paged_attention`).
        context_lens: int32 `[B]`, keys per row including the L new ones.
        slot_mapping: int32 `[B * L]`, each new token's slot (as for `write_kv`).
        offsets: int32 `[B]`, the position of each row's first new token.
        page_size: Tokens per page; must equal `key_pages.shape[2]`.
        eps: The norms' epsilon, finite and positive.
        rope_base: The RoPE base (`rope_theta`), finite and positive.
        scale: Softmax scale; None means `D ** -0.5`.
        stream: Stream or device to run on.

    Returns:
        `(h, mlp, key_pages, value_pages)`: the stream after attention `[B, L, H]`, the MLP
        output `[B, L, H]` (the caller adds it), and the updated pages (written in place, as
        `write_kv` does: use them instead of the inputs).

    Raises:
        ValueError: On shapes or dtypes that do not fit together (naming the weight), or a bad
            eps, rope_base, scale or page size.
    """
    return _ext.decoder_layer(
        residual,
        pending,
        list(weights),
        key_pages,
        value_pages,
        block_table,
        context_lens,
        slot_mapping,
        offsets,
        page_size,
        eps=eps,
        rope_base=rope_base,
        scale=scale,
        stream=stream,
    )


#: The `native` entry point of the `pagekernels.backends` group.
backend = ModuleBackend("native", sys.modules[__name__])
