"""Paged KV storage: page allocator with ownership and copy-on-write, per-request page lists,
per-step batch metadata, KV page storage.
"""

from importlib.metadata import version

from pagepool.errors import (
    InvalidArgument,
    InvalidMetadata,
    InvalidPageId,
    PageAlreadyFree,
    PageListReleased,
    PagePoolError,
    PoolExhausted,
)
from pagepool.metadata import BatchMetadata, packed_int32
from pagepool.metrics import PoolMetrics
from pagepool.pagelist import AppendResult, PageList
from pagepool.pool import GrowthListener, PageCopy, PagePool, pages_for
from pagepool.storage import SUPPORTED_DTYPES, KVStorage

__version__ = version("pagepool")

__all__ = [
    "AppendResult",
    "BatchMetadata",
    "GrowthListener",
    "InvalidArgument",
    "InvalidMetadata",
    "InvalidPageId",
    "KVStorage",
    "PageAlreadyFree",
    "PageCopy",
    "PageList",
    "PageListReleased",
    "PagePool",
    "PagePoolError",
    "PoolExhausted",
    "PoolMetrics",
    "SUPPORTED_DTYPES",
    "packed_int32",
    "__version__",
    "pages_for",
]
