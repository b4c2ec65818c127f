"""The engine's structlog events: one emitter, so every event carries the same core fields.

Every event has `request_id`, `step`, `num_tokens` and `num_pages`; nothing is logged per layer.
The library never configures structlog (see `pageruntime.logging.configure_logging`).

| event | level | `num_tokens` | `num_pages` | extras |
|---|---|---|---|---|
| `request_admitted` | info | tokens to prefill | pages they need | `num_free_pages`, `resumed` |
| `prefill_chunk` | info | chunk length | pages held | `context_len` |
| `first_token` | info | prompt + 1 | pages held | `token` |
| `request_preempted` | info | prompt + output | pages freed | |
| `request_finished` | info | output tokens | pages freed | `finish_reason` |
| `request_failed` | warning | output tokens | pages freed | `finish_reason`, `error` |
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from pageruntime.request import Request

__all__ = ["emit"]

log = structlog.get_logger(__name__)


def emit(
    event: str,
    request: Request,
    step: int,
    *,
    num_tokens: int,
    num_pages: int | None = None,
    level: int = logging.INFO,
    **fields: object,
) -> None:
    """Log one request event.

    Args:
        event: The snake_case event name.
        request: The request (its id is logged as `request_id`).
        step: The engine step it happened in.
        num_tokens: The event's token count (see each event's call site).
        num_pages: The event's page count; by default the pages the request holds.
        level: A `logging` level.
        **fields: Event-specific extras.
    """
    log.log(
        level,
        event,
        request_id=request.request_id,
        step=step,
        num_tokens=num_tokens,
        num_pages=request.num_pages if num_pages is None else num_pages,
        **fields,
    )
