"""Host-side checks of paged-attention metadata values, for callers that build their own.

The ops check shapes and dtypes only and never read array values (that would cost a device
sync per layer). pagepool's `BatchMetadata` validates the metadata it builds, once per step;
pagekernels cannot import pagepool, so direct callers of the kernels (tests, benchmarks, other
runtimes) call `validate_paged_metadata` on their host lists instead.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["validate_paged_metadata"]


def validate_paged_metadata(
    block_table: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    *,
    query_len: int,
    page_size: int,
    num_pages: int,
    allow_shared_pages: bool = False,
) -> None:
    """Checks that a block table and context lengths describe readable, unaliased K/V.

    Row b's live pages are its first `ceil(context_lens[b] / page_size)` entries; the rest must
    be -1. These are the rules of pagepool's `BatchMetadata` (same contexts, coverage, page
    range and -1 padding), with these differences:

    - Sharing: `BatchMetadata` lets a page repeat as often as it has holders (`build`: the
      pool's refcounts; `from_host`: the pages named in `shared_page_ids`). Without a pool
      this function takes one switch, `allow_shared_pages`: off, every live page belongs to
      one row; on, any page may appear in several rows. Either way no page repeats within a row.
    - Scope: `BatchMetadata` also builds and checks `slot_mapping` (no slot written twice),
      a fixed block-table width, and rejects a batch with no real row; here a batch of empty
      rows is valid (the kernels return zeros for it).
    - Errors: plain `ValueError` (`BatchMetadata` raises `InvalidMetadata`, a `ValueError`).

    Args:
        block_table: Host rows of page ids (the int32 `[B, max_pages]` array's values).
        context_lens: Host keys per row (the int32 `[B]` array's values).
        query_len: L, the new tokens per row in this step.
        page_size: Tokens per page.
        num_pages: P, pages in storage (valid ids are `0 .. P-1`).
        allow_shared_pages: Accept a live page in several rows (pages shared on purpose, as
            copy-on-write forks share their prefix). A page repeated within one row is always
            an error.

    Raises:
        ValueError: On a negative context, a context of 1..L-1 tokens, a context not covered
            by the row's pages, a page id outside storage, a live page used twice, padding
            other than -1, or inconsistent sizes.
    """
    if page_size <= 0:
        raise ValueError(f"page_size={page_size} must be positive")
    if query_len < 1:
        raise ValueError(f"query_len={query_len} must be at least 1")
    if len(block_table) != len(context_lens):
        raise ValueError(
            f"block_table has {len(block_table)} rows but context_lens has "
            f"{len(context_lens)} entries; expected one context length per row"
        )
    owners: dict[int, tuple[int, int]] = {}
    for b, (row, context_len) in enumerate(zip(block_table, context_lens, strict=True)):
        if context_len < 0:
            raise ValueError(f"context_lens[{b}]={context_len} is negative; expected >= 0")
        if 0 < context_len < query_len:
            raise ValueError(
                f"context_lens[{b}]={context_len} is shorter than query_len={query_len}; a row "
                f"holds at least its {query_len} new tokens, or is empty (0)"
            )
        live_pages = -(-context_len // page_size)
        if live_pages > len(row):
            raise ValueError(
                f"context_lens[{b}]={context_len} needs {live_pages} pages of {page_size} but "
                f"block_table[{b}] has {len(row)} entries"
            )
        for i, page in enumerate(row):
            entry = f"block_table[{b}][{i}]={page}"
            if i >= live_pages:
                if page != -1:
                    raise ValueError(
                        f"{entry} follows the row's {live_pages} live pages "
                        f"(context_lens[{b}]={context_len}); padding must be -1"
                    )
                continue
            if page == -1:
                raise ValueError(
                    f"{entry} is padding, but context_lens[{b}]={context_len} is not covered: "
                    f"it needs {live_pages} pages of {page_size}"
                )
            if page < -1:
                raise ValueError(f"{entry} is negative; padding must be -1")
            if page >= num_pages:
                raise ValueError(
                    f"{entry} is outside storage; expected a page id in [0, {num_pages})"
                )
            owner = owners.get(page)
            if owner is not None and (not allow_shared_pages or owner[0] == b):
                raise ValueError(
                    f"{entry} repeats page {page} of block_table[{owner[0]}][{owner[1]}]; a live "
                    "page belongs to one row"
                )
            owners[page] = (b, i)
