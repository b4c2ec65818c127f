"""Continuous-batching scheduler that emits paged-attention metadata."""
