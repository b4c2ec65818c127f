"""`BatchMetadata`: the validated page tables of one model call, shared by every layer.

Built once per step on the host from plain Python lists, so kernels need not re-validate values
per layer and the forward pass never calls `.tolist()`. The arrays are views of one array
(`packed_int32`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import mlx.core as mx

from pagepool._validate import as_int
from pagepool.errors import InvalidMetadata
from pagepool.pagelist import PageList
from pagepool.pool import pages_for

__all__ = ["BatchMetadata", "packed_int32"]

_PAD = -1
_FIELD_ALIGN = 4  # int32 entries: each packed field starts on a 16-byte boundary


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class BatchMetadata:
    """Page tables, context lengths and write slots of a batch of `B` rows, `L` new tokens each.

    Row `b`'s last `L` tokens are this step's new tokens. A padding row has context length 0,
    a block-table row of -1, slots -1 and positions 0. Build it with `build` (from page lists)
    or `from_host` (from plain lists); both validate.

    Attributes:
        block_table: int32 `[B, max_pages]`; page id of row b's logical page i, -1 padded.
        context_lens: int32 `[B]`; tokens of row b, including the `L` new ones.
        slot_mapping: int32 `[B * L]`; slot of each new token (row-major), -1 for padding rows.
        positions: int32 `[B * L]`; absolute position of each new token, 0 for padding rows.
        query_len: `L`, new tokens per row.
        page_size: Tokens per page.
        num_pages: Pool capacity when built; every page id is below it.
        block_table_host: `block_table` as nested tuples (errors, kernel planning).
        context_lens_host: `context_lens` as a tuple.
        slot_mapping_host: `slot_mapping` as a tuple.
    """

    block_table: mx.array
    context_lens: mx.array
    slot_mapping: mx.array
    positions: mx.array
    query_len: int
    page_size: int
    num_pages: int
    block_table_host: tuple[tuple[int, ...], ...]
    context_lens_host: tuple[int, ...]
    slot_mapping_host: tuple[int, ...]

    @property
    def batch_size(self) -> int:
        """`B`, rows including padding rows."""
        return len(self.context_lens_host)

    @property
    def max_pages(self) -> int:
        """Width of `block_table`."""
        return len(self.block_table_host[0])

    @classmethod
    def build(
        cls,
        rows: Sequence[PageList | None],
        slots: Sequence[Sequence[int]] | None = None,
        *,
        query_len: int,
        max_pages: int | None = None,
    ) -> BatchMetadata:
        """Metadata for `rows`, whose last `query_len` tokens were just appended.

        Args:
            rows: One page list per row, or None for a padding row; all from one pool.
            slots: Optional cross-check: the slots `append` returned for each row (empty for
                padding rows); they must equal the slots derived from the page lists.
            query_len: `L`, new tokens per real row (>= 1).
            max_pages: Block-table width; None means the widest row. The engine passes a
                stable, bucketed width so shapes stay stable for `mx.compile`.

        Raises:
            InvalidMetadata: A row is released, from another pool, too short for `query_len`,
                wider than `max_pages`, aliases a page it does not share, or a slot differs.
            InvalidArgument: `query_len` or `max_pages` is not an int >= 1.
        """
        if not isinstance(rows, Sequence) or not rows:
            raise InvalidMetadata(f"rows must be a non-empty sequence, got {rows!r}")
        query_len = as_int(query_len, "query_len", minimum=1)
        pool = None
        seen: set[int] = set()
        page_rows: list[tuple[int, ...]] = []
        context_lens: list[int] = []
        for b, row in enumerate(rows):
            if row is None:
                page_rows.append(())
                context_lens.append(0)
                continue
            if not isinstance(row, PageList):
                raise InvalidMetadata(f"rows[{b}] must be a PageList or None, got {row!r}")
            if row.released:
                raise InvalidMetadata(f"rows[{b}] was released; its pages are back in the pool")
            if id(row) in seen:
                raise InvalidMetadata(f"rows[{b}] is a PageList already used by an earlier row")
            seen.add(id(row))
            if pool is None:
                pool = row.pool
            elif row.pool is not pool:
                raise InvalidMetadata(f"rows[{b}] comes from another pool than rows[0..{b - 1}]")
            if row.context_len < query_len:  # a PageList row is real even when empty
                raise _short_context(b, row.context_len, query_len)
            page_rows.append(row.page_ids)
            context_lens.append(row.context_len)
        if pool is None:
            raise InvalidMetadata("a batch needs at least one real (non-None) row")
        metadata = _validated(
            page_rows,
            context_lens,
            query_len=query_len,
            page_size=pool.page_size,
            num_pages=pool.capacity,
            max_pages=max_pages,
            max_holders=pool.refcount,
        )
        if slots is not None:
            _check_slots(metadata, slots)
        return metadata

    @classmethod
    def from_host(
        cls,
        block_table: Sequence[Sequence[int]],
        context_lens: Sequence[int],
        *,
        query_len: int,
        page_size: int,
        num_pages: int,
        max_pages: int | None = None,
        shared_page_ids: Collection[int] = (),
    ) -> BatchMetadata:
        """Metadata from plain lists (tests, kernels), validated like `build`.

        Args:
            block_table: Page ids per row in logical order; trailing -1 entries are padding.
                A row with context length 0 is a padding row.
            context_lens: Tokens per row, including the `query_len` new ones.
            query_len: `L`, new tokens per real row (>= 1).
            page_size: Tokens per page.
            num_pages: Pages in storage; every id must be below it.
            max_pages: Block-table width; None means the widest row.
            shared_page_ids: Pages that may appear in several rows (shared on purpose).
        """
        query_len = as_int(query_len, "query_len", minimum=1)
        page_size = as_int(page_size, "page_size", minimum=1)
        num_pages = as_int(num_pages, "num_pages", minimum=1)
        if len(block_table) != len(context_lens):
            raise InvalidMetadata(
                f"block_table has {len(block_table)} rows but context_lens has "
                f"{len(context_lens)}; expected one context length per row"
            )
        if not block_table:
            raise InvalidMetadata("a batch needs at least one row")
        page_rows = [_strip_padding(b, row) for b, row in enumerate(block_table)]
        lens = [as_int(n, f"context_lens[{b}]") for b, n in enumerate(context_lens)]
        shared = frozenset(shared_page_ids)
        return _validated(
            page_rows,
            lens,
            query_len=query_len,
            page_size=page_size,
            num_pages=num_pages,
            max_pages=max_pages,
            max_holders=lambda page_id: len(page_rows) if page_id in shared else 1,
        )


def _validated(
    page_rows: list[tuple[int, ...]],
    context_lens: list[int],
    *,
    query_len: int,
    page_size: int,
    num_pages: int,
    max_pages: int | None,
    max_holders: Callable[[int], int],
) -> BatchMetadata:
    """Check the rows against every rule, then build the arrays (`packed_int32`).

    `query_len`, `page_size` and `num_pages` are validated by the calling factory.
    """
    widest = max(len(row) for row in page_rows)
    width = widest if max_pages is None else as_int(max_pages, "max_pages", minimum=1)
    if widest > width:
        b = next(b for b, row in enumerate(page_rows) if len(row) == widest)
        raise InvalidMetadata(f"row {b} has {widest} pages but max_pages={width}")
    if all(n == 0 for n in context_lens):
        raise InvalidMetadata("a batch needs at least one real row (context_len > 0)")
    block_table: list[tuple[int, ...]] = []
    slot_mapping: list[int] = []
    positions: list[int] = []
    for b, (row, context_len) in enumerate(zip(page_rows, context_lens, strict=True)):
        _check_row(b, row, context_len, query_len=query_len, page_size=page_size,
                   num_pages=num_pages)  # fmt: skip
        block_table.append(row + (_PAD,) * (width - len(row)))
        if context_len == 0:
            slot_mapping += [_PAD] * query_len
            positions += [0] * query_len
            continue
        row_positions = range(context_len - query_len, context_len)
        positions += row_positions
        slot_mapping += (row[t // page_size] * page_size + t % page_size for t in row_positions)
    _check_aliasing(page_rows, max_holders)
    written = [slot for slot in slot_mapping if slot != _PAD]
    if len(set(written)) != len(written):
        duplicate = next(slot for slot, n in Counter(written).items() if n > 1)
        raise InvalidMetadata(f"slot {duplicate} is written by two new tokens in one step")
    table, lens, slots, positions_ = packed_int32(
        list(itertools.chain.from_iterable(block_table)), context_lens, slot_mapping, positions
    )
    return BatchMetadata(
        block_table=table.reshape(len(block_table), width),
        context_lens=lens,
        slot_mapping=slots,
        positions=positions_,
        query_len=query_len,
        page_size=page_size,
        num_pages=num_pages,
        block_table_host=tuple(block_table),
        context_lens_host=tuple(context_lens),
        slot_mapping_host=tuple(slot_mapping),
    )


def packed_int32(*fields: Sequence[int]) -> list[mx.array]:
    """One int32 array per field, each a view of one array holding all of them.

    For the small arrays a step makes from host lists. On MLX's CUDA backend an array made from
    host data lives in managed memory, whose pages the first kernel to read them migrates to
    the GPU, with its CTAs faulting; an array of at most 8 bytes (the lengths at B <= 2) stays
    in host memory instead, read over PCIe by every kernel. One array per step migrates once,
    and with each field padded to a multiple of 16 bytes it is never that small
    (`benchmarks/metadata_placement.py`, `docs/performance.md`).
    """
    flat: list[int] = []
    starts = []
    for field in fields:
        starts.append(len(flat))
        flat += field
        flat += [0] * (-len(flat) % _FIELD_ALIGN)
    packed = mx.array(flat, dtype=mx.int32)
    return [packed[start : start + len(field)] for start, field in zip(starts, fields, strict=True)]


def _check_row(
    b: int, row: tuple[int, ...], context_len: int, *, query_len: int, page_size: int,
    num_pages: int,
) -> None:  # fmt: skip
    """Row `b` covers its context with exactly the pages it needs, all inside storage."""
    needed = pages_for(context_len, page_size)
    if len(row) != needed:
        raise InvalidMetadata(
            f"context_lens[{b}]={context_len} needs {needed} page(s) of {page_size}, "
            f"but the row has {len(row)}"
        )
    if row and (min(row) < 0 or max(row) >= num_pages):
        i, page_id = next((i, p) for i, p in enumerate(row) if not 0 <= p < num_pages)
        raise InvalidMetadata(
            f"block_table[{b}, {i}]={page_id} is outside storage [0, {num_pages})"
        )
    if 0 < context_len < query_len:
        raise _short_context(b, context_len, query_len)


def _short_context(b: int, context_len: int, query_len: int) -> InvalidMetadata:
    return InvalidMetadata(
        f"context_lens[{b}]={context_len} is shorter than query_len={query_len}; "
        "every real row must hold its new tokens"
    )


def _check_aliasing(page_rows: list[tuple[int, ...]], max_holders: Callable[[int], int]) -> None:
    """A page may appear in several rows only if it has that many holders (shared); a row never
    holds the same page twice (its logical pages would overwrite each other)."""
    if sum(map(len, page_rows)) == len(set().union(*page_rows)):
        return  # the common case, no page appears twice: skip counting
    for b, row in enumerate(page_rows):
        if len(set(row)) != len(row):
            page_id = next(p for p, n in Counter(row).items() if n > 1)
            raise InvalidMetadata(
                f"block_table[{b}] holds page {page_id} twice; a row's pages differ"
            )
    uses = Counter(page_id for row in page_rows for page_id in row)
    for page_id, count in uses.items():
        if count > 1 and count > max_holders(page_id):
            raise InvalidMetadata(
                f"page {page_id} appears {count} times in the batch but is not shared "
                f"that often (at most {max_holders(page_id)} holder(s))"
            )


def _strip_padding(b: int, row: Sequence[int]) -> tuple[int, ...]:
    ids = [as_int(page_id, f"block_table[{b}]", minimum=_PAD) for page_id in row]
    while ids and ids[-1] == _PAD:
        ids.pop()
    if _PAD in ids:
        raise InvalidMetadata(f"block_table[{b}]={list(row)}: -1 padding may only trail the row")
    return tuple(ids)


def _check_slots(metadata: BatchMetadata, slots: Sequence[Sequence[int]]) -> None:
    if len(slots) != metadata.batch_size:
        raise InvalidMetadata(f"slots has {len(slots)} rows, expected {metadata.batch_size}")
    L = metadata.query_len
    expected = metadata.slot_mapping_host
    for b, row_slots in enumerate(slots):
        want = [] if metadata.context_lens_host[b] == 0 else list(expected[b * L : (b + 1) * L])
        if list(row_slots) != want:
            raise InvalidMetadata(
                f"slots[{b}]={list(row_slots)} differ from the page list's last {L} slots {want}"
            )
