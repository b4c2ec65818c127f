"""Random sequences of append / fork / write / release / exhaustion across many requests.

A hypothesis state machine keeps a model of every live request (its tokens) and, after every
step, checks ownership, reference counts, accounting, context lengths, and that the block tables
of a `BatchMetadata` read each request's tokens back from a tiny NaN-poisoned `KVStorage`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import mlx.core as mx
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from pagepool_test_helpers import snapshot, write_tokens

from pagepool import BatchMetadata, KVStorage, PageList, PageListReleased, PagePool, PoolExhausted


@dataclass
class Request:
    pages: PageList
    tokens: list[int] = field(default_factory=list)


class PagePoolMachine(RuleBasedStateMachine):
    """Model: the live requests and their tokens; the system: pool, page lists, storage."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Request] = []
        self.released: list[PageList] = []
        self.next_token = 1

    @initialize(page_size=st.integers(1, 5), num_pages=st.integers(1, 10), growable=st.booleans())
    def create_pool(self, page_size: int, num_pages: int, growable: bool) -> None:
        self.pool = PagePool(page_size, num_pages, growable=growable)
        self.storage = KVStorage(
            self.pool, num_layers=1, num_kv_heads=1, head_dim=1, dtype=mx.float32,
            fill_value=math.nan,
        )  # fmt: skip

    # -- rules -----------------------------------------------------------------------------

    @rule(num_tokens=st.integers(0, 12))
    def add_request(self, num_tokens: int) -> None:
        request = Request(PageList(self.pool))
        self.requests.append(request)
        self._append(request, num_tokens)

    @rule(index=st.integers(0, 99), num_tokens=st.sampled_from([1, 1, 1, 2, 3, 7]))
    def append(self, index: int, num_tokens: int) -> None:
        if self.requests:
            self._append(self._pick(index), num_tokens)

    @rule(index=st.integers(0, 99), writer=st.sampled_from(["none", "parent", "child"]))
    def fork(self, index: int, writer: str) -> None:
        if not self.requests:
            return
        parent = self._pick(index)
        child = Request(parent.pages.fork(), list(parent.tokens))
        self.requests.append(child)
        if writer != "none":  # writing right after a fork is where copy-on-write happens
            self._append(parent if writer == "parent" else child, 1)

    @rule(index=st.integers(0, 99))
    def release(self, index: int) -> None:
        if not self.requests:
            return
        request = self.requests.pop(index % len(self.requests))
        page_ids = request.pages.page_ids
        before = [self.pool.refcount(page_id) for page_id in page_ids]
        request.pages.release()
        after = [self.pool.refcount(page_id) for page_id in page_ids]
        assert all(b - a == 1 for b, a in zip(before, after, strict=True))  # page ids are unique
        state = snapshot(self.pool)
        request.pages.release()  # a second release changes nothing
        assert snapshot(self.pool) == state
        self.released.append(request.pages)

    @rule(index=st.integers(0, 99))
    def exhaust(self, index: int) -> None:
        if not self.requests:
            return
        request = self._pick(index)
        too_many = (self.pool.num_free + 1) * self.pool.page_size + self.pool.page_size
        if self.pool.growable:  # a growable pool never refuses; it grows on the next append
            assert request.pages.can_append(too_many)
            return
        state = snapshot(self.pool, request.pages)
        assert not request.pages.can_append(too_many)
        try:
            request.pages.append(too_many)
        except PoolExhausted as error:
            assert error.requested > error.free == self.pool.num_free
            event("exhausted")
        else:
            raise AssertionError("an append larger than the free pages succeeded")
        assert snapshot(self.pool, request.pages) == state

    @rule(index=st.integers(0, 99))
    def use_after_release(self, index: int) -> None:
        if not self.released:
            return
        pages = self.released[index % len(self.released)]
        try:
            pages.append(1)
        except PageListReleased:
            pass
        else:
            raise AssertionError("append on a released list succeeded")

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def accounting_and_ownership(self) -> None:
        if not hasattr(self, "pool"):
            return
        pool, page_size = self.pool, self.pool.page_size
        holders = Counter(p for request in self.requests for p in request.pages.page_ids)
        fills: dict[int, int] = {}
        for request in self.requests:
            pages = request.pages
            assert pages.context_len == len(request.tokens)
            assert len(pages.page_ids) == -(-pages.context_len // page_size)
            for i, page_id in enumerate(pages.page_ids):
                fill = min(page_size, pages.context_len - i * page_size)
                assert fills.setdefault(page_id, fill) == fill  # sharers see one prefix
        assert all(pool.refcount(p) == holders[p] for p in range(pool.capacity))
        metrics = pool.metrics()
        assert metrics.num_live_pages == len(holders) == pool.num_live
        assert metrics.num_free_pages + metrics.num_live_pages == metrics.capacity
        assert metrics.num_shared_pages == sum(count > 1 for count in holders.values())
        assert metrics.tail_waste_slots == sum(page_size - fill for fill in fills.values())
        assert self.storage.num_pages == pool.capacity

    @invariant()
    def block_tables_reconstruct_every_request(self) -> None:
        rows, last_slots = [], set()
        for request in self.requests:
            # One batch cannot write one slot twice (a fork after the last append shares it).
            pages = request.pages
            if pages.context_len and pages.slots(pages.context_len - 1, pages.context_len)[0] \
                    not in last_slots:  # fmt: skip
                last_slots.add(pages.slots(pages.context_len - 1, pages.context_len)[0])
                rows.append(request)
        if not rows:
            return
        metadata = BatchMetadata.build([None] + [r.pages for r in rows], query_len=1)
        event(f"batch of {min(len(rows), 4)}{'+' if len(rows) >= 4 else ''} rows")
        stored = self.storage.keys[0].reshape(-1).tolist()  # [P * page_size], one head, D = 1
        page_size = self.pool.page_size
        for b, request in enumerate(rows, start=1):
            table, context_len = metadata.block_table_host[b], metadata.context_lens_host[b]
            read = [stored[table[t // page_size] * page_size + t % page_size]
                    for t in range(context_len)]  # fmt: skip
            assert read == request.tokens

    # -- helpers ---------------------------------------------------------------------------

    def _pick(self, index: int) -> Request:
        return self.requests[index % len(self.requests)]

    def _append(self, request: Request, num_tokens: int) -> None:
        pages, page_size = request.pages, self.pool.page_size
        room = len(pages.page_ids) * page_size - pages.context_len
        new_pages = -(-max(0, num_tokens - room) // page_size)
        allocations, capacity = self.pool.metrics().num_allocations, self.pool.capacity
        state = snapshot(self.pool, pages)
        predicted = pages.can_append(num_tokens)
        try:
            result = pages.append(num_tokens)
        except PoolExhausted:
            assert not predicted and snapshot(self.pool, pages) == state
            event("append refused")
            return
        assert predicted
        # Pages are allocated only on overflow, plus one per copy-on-write copy.
        assert self.pool.metrics().num_allocations - allocations == new_pages + len(result.copies)
        if result.copies:
            event("copy-on-write")
        if self.pool.capacity > capacity:
            event("growth")
        self.storage.copy_pages(result.copies)
        tokens = list(range(self.next_token, self.next_token + num_tokens))
        self.next_token += num_tokens
        write_tokens(self.storage, result.slots, tokens)
        request.tokens += tokens


PagePoolMachine.TestCase.settings = settings(
    max_examples=1000,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPagePoolMachine = PagePoolMachine.TestCase
