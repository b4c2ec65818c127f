"""`configure_logging`: how a command line shows the engine's structlog events.

The library only emits events (`request_admitted`, `prefill_chunk`, `first_token`,
`request_finished`, `request_preempted`, `request_failed`); applications choose the output.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

__all__ = ["LogFormat", "configure_logging"]

LogFormat = Literal["console", "json", "quiet"]


def configure_logging(fmt: LogFormat = "quiet") -> None:
    """Configure structlog globally, for applications (the library never calls it).

    Args:
        fmt: "console" for readable lines on stderr, "json" for one JSON object per line on
            stderr, "quiet" (default) to drop every event.

    Raises:
        ValueError: `fmt` is not one of the three formats.
    """
    if fmt == "quiet":
        structlog.configure(
            processors=[],
            wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
            logger_factory=structlog.ReturnLoggerFactory(),
            cache_logger_on_first_use=False,
        )
        return
    if fmt == "json":
        renderer: structlog.typing.Processor = structlog.processors.JSONRenderer()
    elif fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        raise ValueError(f"log format must be 'console', 'json' or 'quiet', got {fmt!r}")
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
