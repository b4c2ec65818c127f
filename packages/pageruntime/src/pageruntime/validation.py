"""Checks at the engine's boundary: its arguments and the model before any storage is made,
and every submitted request before anything is queued. Each raises with what was wrong and
what was expected."""

from __future__ import annotations

import operator
from collections.abc import Iterable

from pagepool import PagePool
from pageruntime.errors import RequestRejected
from pageruntime.protocols import KVStore, StepModel
from pageruntime.sampling import SamplingParams
from pageruntime.scheduler import AdmissionPolicy

__all__ = [
    "as_int",
    "check_engine_arguments",
    "check_kv_store",
    "check_model",
    "validated_request",
]

_TOKEN_ID_LIMIT = 2**31  # token ids travel as int32


def check_engine_arguments(
    *,
    num_pages: object,
    page_size: object,
    max_batch_size: object,
    prefill_step: object,
    admission: object,
    sampler: object,
    overlap_decode: object,
) -> None:
    """The `Engine` arguments other than the model (see `Engine` for what they must be)."""
    for name, value in (
        ("num_pages", num_pages),
        ("page_size", page_size),
        ("max_batch_size", max_batch_size),
        ("prefill_step", prefill_step),
    ):
        _check_positive_int(name, value)
    if admission not in set(AdmissionPolicy):
        raise ValueError(f"admission must be 'reserve' or 'optimistic', got {admission!r}")
    if not isinstance(overlap_decode, bool):
        raise TypeError(f"overlap_decode must be a bool, got {overlap_decode!r}")
    if overlap_decode and admission != AdmissionPolicy.RESERVE:
        raise ValueError(
            "overlap_decode needs admission='reserve': under optimistic admission planning "
            "may preempt a request whose last token is still on the device"
        )
    if sampler is not None and not callable(sampler):
        raise TypeError(f"sampler must be callable, got {type(sampler).__name__}")


def check_model(model: object) -> None:
    """A `StepModel` with a positive `max_seq_len` and a `vocab_size` in `[1, 2**31]`."""
    if not isinstance(model, StepModel):
        raise TypeError(
            "model must implement StepModel (max_seq_len, vocab_size, make_kv_storage, "
            f"step), got {type(model).__name__}"
        )
    _check_positive_int("model.max_seq_len", model.max_seq_len)
    _check_positive_int("model.vocab_size", model.vocab_size)
    if model.vocab_size > _TOKEN_ID_LIMIT:
        raise ValueError(
            f"model.vocab_size must be <= 2**31 (tokens are int32), got {model.vocab_size}"
        )


def check_kv_store(kv: object, pool: PagePool) -> None:
    """What `model.make_kv_storage(pool)` returned is a `KVStore` over `pool`."""
    if not isinstance(kv, KVStore) or kv.pool is not pool:
        raise TypeError(
            "model.make_kv_storage(pool) must return a KVStore (pool, copy_pages, "
            "step_arrays, snapshot, restore) over that pool"
        )


def validated_request(
    prompt_ids: Iterable[int],
    params: SamplingParams | None,
    *,
    vocab_size: int,
    max_seq_len: int,
) -> tuple[tuple[int, ...], SamplingParams]:
    """The prompt as a tuple of token ids and the parameters (`SamplingParams()` for None).

    Raises:
        RequestRejected: The prompt is empty, not a sequence of token ids in
            `[0, vocab_size)`, or not shorter than `max_seq_len`, or a stop token is not a
            token id.
        TypeError: `params` is not a `SamplingParams`.
    """
    params = SamplingParams() if params is None else params
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
    if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Iterable):
        raise RequestRejected(f"prompt_ids must be a sequence of ints, got {prompt_ids!r}")
    prompt = tuple(
        _token_id(token, f"prompt_ids[{index}]", vocab_size)
        for index, token in enumerate(prompt_ids)
    )
    if not prompt:
        raise RequestRejected("prompt_ids is empty; a request needs one or more tokens")
    for index, token in enumerate(params.stop_token_ids):
        _token_id(token, f"stop_token_ids[{index}]", vocab_size)
    if len(prompt) >= max_seq_len:
        raise RequestRejected(
            f"prompt has {len(prompt)} tokens but the model's max_seq_len is "
            f"{max_seq_len}; it must be shorter to leave room for output"
        )
    return prompt, params


def _token_id(value: object, where: str, vocab_size: int) -> int:
    """`value` as a token id of the model, or `RequestRejected` naming it and its index."""
    token = None if isinstance(value, bool) else as_int(value)
    if token is None or not 0 <= token < vocab_size:
        raise RequestRejected(
            f"{where}={value!r:.40} is not a token id of the model: expected an int in "
            f"[0, {vocab_size}) (vocab_size={vocab_size})"
        )
    return token


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def as_int(value: object) -> int | None:
    """`value` as an int (numpy integers included), or None if it is not an integer."""
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None
