"""What the `qwen3model` subcommands do: `generate`, `serve-bench` and `save-model`.

Each handler takes the parsed arguments and returns an exit status; `cli` parses and reports.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from collections.abc import Iterator, Sequence

import mlx.core as mx
import structlog
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pagepool import pages_for
from pageruntime import Engine, SamplingParams
from qwen3model.attention import AttentionMode
from qwen3model.config import QuantizationArgs
from qwen3model.loading import DTYPES, load_model, save_pretrained
from qwen3model.model import Qwen3Model
from qwen3model.provenance import collect_provenance
from qwen3model.report import render_table, write_json
from qwen3model.serving import (
    CPU_TRACE,
    GPU_TRACE,
    TRACE_OVERRIDES,
    make_requests,
    run_variant,
    serve_bench_trace,
)
from qwen3model.tokenizer import StreamDecoder, Tokenizer

__all__ = [
    "CPU_TRACE",
    "DEFAULT_CPU_MODEL",
    "DEFAULT_GPU_MODEL",
    "DEFAULT_MAX_TOKENS",
    "GPU_TRACE",
    "InputError",
    "UsageError",
    "generate",
    "save_model",
    "select_device",
    "serve_bench",
    "serve_bench_trace",
]

log = structlog.get_logger(__name__)

DEFAULT_GPU_MODEL = "synthetic:qwen3-4b"
DEFAULT_CPU_MODEL = "synthetic:qwen3-small"
DEFAULT_MAX_TOKENS = 64
DEFAULT_PAGE_SIZE = 16
DEFAULT_BATCH_SIZE = 4
DEFAULT_PREFILL_STEP = 128


class UsageError(Exception):
    """A bad command line, reported as one line with exit status 2."""


class InputError(Exception):
    """A value from the command line that the project rejected (an unknown model or backend,
    bad sampling, trace or quantization values), reported as one line with exit status 1."""


@contextlib.contextmanager
def _rejected_as_input_error() -> Iterator[None]:
    """Turns the `ValueError` of a call that only checks command-line values into an
    `InputError`; every other error keeps its type and traceback."""
    try:
        yield
    except ValueError as error:
        raise InputError(str(error)) from error


# -- shared ---------------------------------------------------------------------------------


def select_device(device: str | None) -> None:
    """Makes `device` ("cpu", "gpu", or None for MLX's default) the default device."""
    if device == "gpu" and not mx.is_available(mx.gpu):
        raise UsageError("qwen3model: error: --device gpu, but this MLX build has no GPU")
    if device is not None:
        mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)


def _on_gpu() -> bool:
    return mx.default_device() == mx.gpu


def _device_name() -> str:
    return "gpu" if _on_gpu() else "cpu"


def _stderr() -> Console:
    return Console(stderr=True)


def _model_source(args: argparse.Namespace) -> str:
    """`--model`, or the device's default model."""
    return args.model or (DEFAULT_GPU_MODEL if _on_gpu() else DEFAULT_CPU_MODEL)


def _load(
    source: str, args: argparse.Namespace, mode: AttentionMode
) -> tuple[Qwen3Model, Tokenizer]:
    dtype = None if args.dtype == "auto" else DTYPES[args.dtype]
    start = time.perf_counter()
    with Progress(
        TextColumn(f"loading {source}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_stderr(),
        transient=True,
    ) as progress:
        task = progress.add_task("load", total=None)
        with _rejected_as_input_error():
            model, tokenizer = load_model(
                source,
                kernel_backend=args.kernel_backend,
                attention_mode=mode,
                dtype=dtype,
                seed=args.weights_seed,
                on_progress=lambda done, total: progress.update(task, completed=done, total=total),
            )
    model.compile_decode = getattr(args, "compile_decode", False)
    log.info(
        "model_loaded",
        source=source,
        dtype=_dtype_name(model),
        device=_device_name(),
        seconds=round(time.perf_counter() - start, 2),
    )
    return model, tokenizer


# -- generate -------------------------------------------------------------------------------


def generate(args: argparse.Namespace) -> int:
    """`qwen3model generate`: run the prompts through an engine, stream the text."""
    prompts = list(args.prompts)
    if args.prompt_file is not None:
        if not args.prompt_file.is_file():
            raise FileNotFoundError(f"no prompt file at {args.prompt_file.resolve()}")
        prompts += [line for line in args.prompt_file.read_text().splitlines() if line.strip()]
    if not prompts:
        raise UsageError("qwen3model generate: error: give a prompt or --prompt-file (see --help)")
    mode = AttentionMode.PAGED
    if args.disable_paged_attention:
        mode = AttentionMode.GATHER
    elif args.dense_baseline:
        mode = AttentionMode.DENSE
    model, tokenizer = _load(_model_source(args), args, mode)
    use_template = tokenizer.has_chat_template if args.chat_template is None else args.chat_template
    if use_template and not tokenizer.has_chat_template:
        raise InputError("--chat-template: this model's tokenizer has no chat template")
    if args.system is not None and not use_template:
        raise InputError("--system: this model's tokenizer has no chat template to put it in")
    prompt_ids = [
        tokenizer.encode(_render(tokenizer, p, args.system, use_template)) for p in prompts
    ]
    with _rejected_as_input_error():
        params = SamplingParams(
            max_new_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            stop_token_ids=() if args.ignore_eos else tuple(sorted(tokenizer.eos_token_ids)),
        )
    page_size = args.page_size or DEFAULT_PAGE_SIZE
    batch_size = args.batch_size or DEFAULT_BATCH_SIZE
    longest = max(len(ids) for ids in prompt_ids) + args.max_tokens
    fits_batch = min(batch_size, len(prompts)) * pages_for(longest, page_size)
    engine = Engine(
        model,
        num_pages=args.num_pages or fits_batch,
        page_size=page_size,
        max_batch_size=batch_size,
        prefill_step=args.prefill_step or DEFAULT_PREFILL_STEP,
        admission=args.admission,
        overlap_decode=args.overlap_decode,
    )
    request_ids = [engine.add_request(ids, params) for ids in prompt_ids]
    return _stream_outputs(engine, tokenizer, request_ids, params.stop_token_ids)


def _render(tokenizer: Tokenizer, prompt: str, system: str | None, use_template: bool) -> str:
    if not use_template:
        return prompt
    messages = [{"role": "system", "content": system}] if system else []
    return tokenizer.apply_chat_template([*messages, {"role": "user", "content": prompt}])


def _stream_outputs(
    engine: Engine, tokenizer: Tokenizer, request_ids: list[int], stop_ids: Sequence[int]
) -> int:
    """Streams a single request's text to stdout; prints each of several when it finishes."""
    single = len(request_ids) == 1
    decoders = {rid: StreamDecoder(tokenizer) for rid in request_ids}
    texts = {rid: "" for rid in request_ids}
    failed = generated = 0
    start = time.perf_counter()
    while engine.has_unfinished():
        for event in engine.step():
            rid = event.request_id
            if event.token is not None:
                generated += 1  # stop tokens count: the model generated them
            if event.token is not None and event.token not in stop_ids:
                texts[rid] += decoders[rid].add(event.token)
                if single:
                    sys.stdout.write(texts[rid])
                    sys.stdout.flush()
                    texts[rid] = ""
            if not event.finished:
                continue
            texts[rid] += decoders[rid].flush()
            if event.error is not None:
                failed += 1
                print(f"qwen3model: request {rid} failed: {event.error}", file=sys.stderr)
            if single:
                print(texts[rid])
            else:
                print(f"--- request {rid} ({event.finish_reason}) ---\n{texts[rid]}")
    seconds = time.perf_counter() - start
    _stderr().print(
        f"[dim]{generated} tokens generated, "
        f"{engine.stats.prefill_tokens} prefilled in {seconds:.1f} s[/dim]"
    )
    return 1 if failed else 0


# -- serve-bench ----------------------------------------------------------------------------


def serve_bench(args: argparse.Namespace) -> int:
    """`qwen3model serve-bench`: serve the trace once per variant, print the table."""
    overrides = {name: getattr(args, name) for name in TRACE_OVERRIDES}
    with _rejected_as_input_error():
        trace = serve_bench_trace(on_gpu=_on_gpu(), seed=args.seed, **overrides)
    source = _model_source(args)
    model, _ = _load(source, args, AttentionMode(args.variants[0]))
    requests = make_requests(trace, model.args.vocab_size)
    # Warm-up requests: the shortest prompt and 4 tokens, on a throw-away engine per variant.
    warmup_trace = dataclasses.replace(
        trace,
        num_seqs=max(args.warmup, 1),
        max_input_len=trace.min_input_len,
        min_output_len=4,
        max_output_len=4,
        seed=trace.seed + 1,
    )
    warmup = make_requests(warmup_trace, model.args.vocab_size)[: args.warmup]
    results = []
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tokens"),
        TimeElapsedColumn(),
        console=_stderr(),
    )
    with progress:
        for variant in args.variants:
            # The total is the most the trace can generate; a request may end sooner.
            task = progress.add_task(f"{variant:>6}", total=sum(r.max_new_tokens for r in requests))
            if warmup:
                run_variant(
                    model,
                    AttentionMode(variant),
                    trace,
                    warmup,
                    admission=args.admission,
                    overlap_decode=args.overlap_decode,
                )
            result = run_variant(
                model,
                AttentionMode(variant),
                trace,
                requests,
                admission=args.admission,
                num_pages=args.num_pages,
                overlap_decode=args.overlap_decode,
                on_token=lambda task=task: progress.advance(task),
            )
            progress.update(task, total=result.output_tokens)
            log.info("bench_variant_finished", variant=variant, wall_s=round(result.wall_s, 2))
            results.append(result)
    prompts = f"{trace.min_input_len}-{trace.max_input_len}"
    outputs = f"{trace.min_output_len}-{trace.max_output_len}"
    title = (
        f"serve-bench: {source} ({_dtype_name(model)}, {_device_name()}), {trace.num_seqs} "
        f"requests, batch {trace.batch_size}, prompts {prompts}, outputs {outputs}, "
        f"page {trace.page_size}"
    )
    render_table(results, title=title)
    if args.json_output is not None:
        context = {
            "model": source,
            "dtype": _dtype_name(model),
            "device": _device_name(),
            "kernel_backend": args.kernel_backend,
            "compile_decode": model.compile_decode,
            "overlap_decode": args.overlap_decode,
            "page_size": trace.page_size,
            "admission": args.admission,
            "num_pages": trace.num_pages if args.num_pages is None else args.num_pages,
        }
        write_json(
            args.json_output,
            results,
            trace=trace,
            context=context,
            provenance=collect_provenance(_device_name()),
        )
    return 0


# -- save-model -----------------------------------------------------------------------------


def save_model(args: argparse.Namespace) -> int:
    """`qwen3model save-model`: load (optionally quantize) and write a Hugging Face directory."""
    model, tokenizer = _load(_model_source(args), args, AttentionMode.PAGED)
    if args.quantize_bits is not None:
        with _rejected_as_input_error():  # a group size that does not divide the layers
            model.quantize(QuantizationArgs(group_size=args.group_size, bits=args.quantize_bits))
    written = save_pretrained(model, tokenizer, args.output, max_shard_bytes=args.max_shard_bytes)
    print(f"wrote {args.output} ({len(written)} weight file(s), dtype {_dtype_name(model)})")
    return 0


def _dtype_name(model: Qwen3Model) -> str:
    return next(name for name, dtype in DTYPES.items() if dtype == model.dtype)
