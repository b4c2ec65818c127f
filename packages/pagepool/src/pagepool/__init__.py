"""Paged KV storage: page allocator with ownership and copy-on-write, per-request page lists, per-step batch metadata, KV page storage."""
