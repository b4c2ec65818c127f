"""Continuous-batching serving engine on `pagepool`: requests, sampling, admission under a KV
page cap, chunked prefill, batched decode, preemption, failure handling, events and counters.

It drives any `StepModel` and never imports a kernel or a model.
"""

from importlib.metadata import version

from pageruntime.engine import Engine
from pageruntime.errors import KVCapacityExceeded, PageRuntimeError, RequestFailed, RequestRejected
from pageruntime.logging import LogFormat, configure_logging
from pageruntime.protocols import KVStore, Sampler, StepModel
from pageruntime.request import FinishReason, RequestOutput, TokenEvent
from pageruntime.sampling import SamplingParams, sample_tokens, token_key
from pageruntime.scheduler import AdmissionPolicy
from pageruntime.stats import EngineStats
from pageruntime.stream import TokenStream

__version__ = version("pageruntime")

__all__ = [
    "AdmissionPolicy",
    "Engine",
    "EngineStats",
    "FinishReason",
    "KVCapacityExceeded",
    "KVStore",
    "LogFormat",
    "PageRuntimeError",
    "RequestFailed",
    "RequestOutput",
    "RequestRejected",
    "Sampler",
    "SamplingParams",
    "StepModel",
    "TokenEvent",
    "TokenStream",
    "__version__",
    "configure_logging",
    "sample_tokens",
    "token_key",
]
