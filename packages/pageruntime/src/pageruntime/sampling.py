"""Sampling: per-request parameters and the default sampler (greedy, temperature, top-k, top-p).

Token `i` of a request is drawn with its own key, `token_key(seed, i)`, so a request samples the
same tokens whatever batch it runs in and however often it is preempted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import mlx.core as mx

__all__ = ["SamplingParams", "sample_tokens", "token_key"]

_MASK64 = (1 << 64) - 1
# Temperatures are applied in float32: smaller ones would round to zero (0 / 0 at the argmax)
# or to a subnormal that a GPU may flush to zero. This one still sends every other logit to
# -inf or far below, so the row samples its argmax, as T -> 0 should.
_SMALLEST_TEMPERATURE = 2.0**-126  # float32's smallest normal number


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How one request picks its tokens and when it stops.

    Attributes:
        max_new_tokens: Most tokens to generate, >= 1 (finish reason `length`).
        temperature: 0 means greedy (argmax); otherwise logits are divided by it, > 0.
        top_p: Keep the smallest set of most likely tokens whose probability reaches
            `top_p`, in (0, 1]; 1 disables it.
        top_k: Keep the `top_k` most likely tokens; 0 disables it.
        stop_token_ids: Generating one of these ends the request (finish reason `stop`);
            the stop token is the last output token.
        seed: Seed of the request's random stream, in [0, 2**64).
    """

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        _check_int("max_new_tokens", self.max_new_tokens, minimum=1)
        _check_int("top_k", self.top_k, minimum=0)
        _check_int("seed", self.seed, minimum=0)
        if self.seed > _MASK64:
            raise ValueError(f"SamplingParams.seed must be < 2**64, got {self.seed}")
        if not _is_real(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ValueError(
                f"SamplingParams.temperature must be a finite float >= 0, got {self.temperature!r}"
            )
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        stop_token_ids = _as_token_ids(self.stop_token_ids)
        object.__setattr__(self, "stop_token_ids", stop_token_ids)

    @property
    def greedy(self) -> bool:
        """Whether tokens are picked by argmax (temperature 0)."""
        return self.temperature == 0


def token_key(seed: int, index: int) -> mx.array:
    """The PRNG key of a request's token `index` (0-based), for `mx.random` functions.

    Returns:
        uint32 `[2]`, `mx.random.key` of a 64-bit mix of `seed` and `index`.
    """
    return mx.random.key(_splitmix64(_splitmix64(seed) ^ index))


def sample_tokens(
    logits: mx.array, params: Sequence[SamplingParams], token_indices: Sequence[int]
) -> mx.array:
    """Pick one token per row: argmax for greedy rows, else temperature, top-k, top-p.

    Args:
        logits: `[B, V]`, any float dtype; row b belongs to a request with `params[b]`.
        params: One `SamplingParams` per row.
        token_indices: Per row, the index of the output token being sampled (its key).

    Returns:
        int32 `[B]`, the chosen token ids (lazy: nothing is evaluated here).

    Raises:
        ValueError: `logits` is not 2-D or the lengths of the three arguments differ.
    """
    if logits.ndim != 2 or logits.shape[0] != len(params) or len(params) != len(token_indices):
        raise ValueError(
            f"sample_tokens: logits of shape {tuple(logits.shape)} need shape [B, V] with "
            f"B = len(params) = len(token_indices), got {len(params)} and {len(token_indices)}"
        )
    greedy_tokens = mx.argmax(logits, axis=-1).astype(mx.int32)
    if all(p.greedy for p in params):
        return greedy_tokens
    B, V = logits.shape
    temperature = mx.array(
        [max(p.temperature, _SMALLEST_TEMPERATURE) if not p.greedy else 1.0 for p in params]
    )
    # Shifted so that the largest logit is 0 before the division: a tiny temperature then
    # sends the others to -inf (as T -> 0 should) instead of the largest to +inf (NaN after).
    logits = logits.astype(mx.float32)
    row_max = logits.max(axis=-1, keepdims=True)
    shifted = mx.where(mx.isfinite(row_max), logits - row_max, logits)
    scaled = shifted / temperature[:, None]
    filtered = _filter_top_k_top_p(scaled, [p.top_k for p in params], [p.top_p for p in params])
    noise = mx.stack(
        [
            mx.zeros((V,)) if p.greedy else mx.random.gumbel((V,), key=token_key(p.seed, index))
            for p, index in zip(params, token_indices, strict=True)
        ]
    )
    sampled = mx.argmax(filtered + noise, axis=-1).astype(mx.int32)
    greedy = mx.array([p.greedy for p in params])
    return mx.where(greedy, greedy_tokens, sampled)


def _filter_top_k_top_p(scaled: mx.array, top_k: list[int], top_p: list[float]) -> mx.array:
    """Set to -inf every logit outside its row's top-k and then its top-p nucleus."""
    B, V = scaled.shape
    sorted_desc = -mx.sort(-scaled, axis=-1)
    ranks = mx.arange(V)[None, :]
    k = mx.array([k if 0 < k < V else V for k in top_k])[:, None]
    sorted_desc = mx.where(ranks < k, sorted_desc, -math.inf)
    probs = mx.softmax(sorted_desc, axis=-1)
    mass_before = mx.cumsum(probs, axis=-1) - probs
    # top_p == 1 must keep everything, even where rounding makes the cumulative mass reach 1.
    p = mx.array([p if p < 1 else math.inf for p in top_p])[:, None]
    # Both conditions keep a prefix of the sorted row, and rank 0 always survives.
    num_kept = ((ranks < k) & (mass_before < p)).sum(axis=-1, keepdims=True)
    threshold = mx.take_along_axis(sorted_desc, num_kept - 1, axis=-1)
    return mx.where(scaled >= threshold, scaled, -math.inf)


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"SamplingParams.{name} must be an int >= {minimum}, got {value!r}")


def _as_token_ids(values: Iterable[int]) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"SamplingParams.stop_token_ids must be ints >= 0, got {values!r}")
    token_ids = tuple(values)
    for token_id in token_ids:
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise ValueError(
                f"SamplingParams.stop_token_ids must be ints >= 0, got {token_id!r} "
                f"in {token_ids!r}"
            )
    return token_ids
