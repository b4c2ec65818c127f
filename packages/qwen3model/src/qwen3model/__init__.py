"""Qwen3 on the paged runtime: model, weight loading, synthetic models and the command line."""
