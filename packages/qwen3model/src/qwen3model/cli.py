"""The `qwen3model` command line: `generate`, `serve-bench` and `save-model`.

`main(argv)` returns an exit status (0 ok, 1 failed, 2 bad usage) so tests can call it; errors
the user can fix are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import mlx.core as mx
import structlog
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pageruntime import Engine, RequestRejected, SamplingParams
from pageruntime.logging import configure_logging
from qwen3model.attention import AttentionMode
from qwen3model.config import QuantizationArgs
from qwen3model.loading import DTYPES, ModelNotFoundError, load_model, save_pretrained
from qwen3model.model import Qwen3Model
from qwen3model.report import render_table, write_json
from qwen3model.serving import Trace, make_requests, run_variant
from qwen3model.tokenizer import StreamDecoder, Tokenizer

__all__ = ["main", "setup_arg_parser"]

log = structlog.get_logger(__name__)

DEFAULT_GPU_MODEL = "synthetic:qwen3-4b"
DEFAULT_CPU_MODEL = "synthetic:qwen3-small"
# The seed's serving trace (GPU default) and a smaller one that takes about a minute on 2 cores.
GPU_TRACE = Trace()
CPU_TRACE = Trace(
    num_seqs=8, min_input_len=64, max_input_len=256, min_output_len=16, max_output_len=48
)
DEFAULT_MAX_TOKENS = 64
DEFAULT_PAGE_SIZE = 16
DEFAULT_BATCH_SIZE = 4
DEFAULT_PREFILL_STEP = 128


class _UsageError(Exception):
    """A bad command line, reported as one line with exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: error: {message} (see --help)")


def setup_arg_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (flags in kebab case, each with help)."""
    parser = _Parser(prog="qwen3model", description="Qwen3 on a paged-attention MLX runtime.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    common = _Parser(add_help=False)
    common.add_argument(
        "--model",
        help="HF model directory, hub id (Qwen/Qwen3-0.6B) or synthetic:qwen3-{tiny,small,0.6b,4b} "
        f"(default: {DEFAULT_GPU_MODEL} on GPU, {DEFAULT_CPU_MODEL} on CPU)",
    )
    common.add_argument("--device", choices=["cpu", "gpu"], help="default: gpu when MLX has one")
    common.add_argument(
        "--dtype",
        choices=[*DTYPES, "auto"],
        default="auto",
        help="weight/KV dtype; auto keeps a checkpoint's dtype, synthetic: bf16 on GPU, f32 on CPU",
    )
    common.add_argument(
        "--kernel-backend", default="native", help="pagekernels backend: native or reference"
    )
    common.add_argument(
        "--weights-seed", type=int, default=0, help="seed of synthetic models' weights"
    )
    common.add_argument(
        "--log-format",
        choices=["quiet", "console", "json"],
        default="quiet",
        help="structlog events on stderr (default: quiet)",
    )

    engine = _Parser(add_help=False)
    engine.add_argument("--page-size", type=int, default=None, help="tokens per KV page")
    engine.add_argument("--num-pages", type=int, help="KV pool capacity (default: fits the batch)")
    engine.add_argument("--batch-size", type=int, default=None, help="most requests at once")
    engine.add_argument("--prefill-step", type=int, default=None, help="prefill chunk in tokens")
    engine.add_argument(
        "--admission",
        choices=["reserve", "optimistic"],
        default="reserve",
        help="reserve prompt+max tokens up front, or admit on prompt and preempt when full",
    )

    generate = commands.add_parser(
        "generate", parents=[common, engine], help="generate text for one or more prompts"
    )
    generate.add_argument("prompts", nargs="*", help="prompts (each one a request)")
    generate.add_argument("--prompt-file", type=Path, help="a file with one prompt per line")
    generate.add_argument(
        "--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="tokens per prompt"
    )
    generate.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    generate.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    generate.add_argument("--top-k", type=int, default=0, help="keep the k best tokens (0: all)")
    generate.add_argument("--seed", type=int, default=0, help="sampling seed")
    generate.add_argument("--ignore-eos", action="store_true", help="do not stop at end tokens")
    generate.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap prompts in the tokenizer's chat template (default: on when it has one)",
    )
    generate.add_argument("--system", help="system message for the chat template")
    ablation = generate.add_mutually_exclusive_group()
    ablation.add_argument(
        "--disable-paged-attention",
        action="store_true",
        help="ablation: pages + gather_kv + dense attention instead of paged attention",
    )
    ablation.add_argument(
        "--dense-baseline",
        action="store_true",
        help="ablation: no pages, per-request caches repacked into a dense batch every step",
    )
    generate.set_defaults(handler=_generate)

    bench = commands.add_parser(
        "serve-bench",
        parents=[common, engine],
        help="serve a request trace with each attention variant and print a table",
    )
    bench.add_argument(
        "--variants",
        nargs="+",
        choices=[m.value for m in AttentionMode],
        default=["dense", "gather", "paged"],
        help="attention paths to run: dense (no pages), gather (pages + gather), paged",
    )
    for name, help_text in [
        ("num-seqs", "requests in the trace"),
        ("min-input-len", "shortest prompt"),
        ("max-input-len", "longest prompt"),
        ("min-output-len", "fewest output tokens"),
        ("max-output-len", "most output tokens"),
    ]:
        default = f"{getattr(GPU_TRACE, name.replace('-', '_'))} on GPU, "
        default += f"{getattr(CPU_TRACE, name.replace('-', '_'))} on CPU"
        bench.add_argument(f"--{name}", type=int, help=f"{help_text} (default: {default})")
    bench.add_argument("--seed", type=int, default=0, help="seed of lengths and prompt tokens")
    bench.add_argument("--warmup", type=int, default=1, help="warm-up requests per variant")
    bench.add_argument("--json-output", type=Path, help="also write the results as JSON here")
    bench.set_defaults(handler=_serve_bench)

    save = commands.add_parser(
        "save-model", parents=[common], help="write a model as a Hugging Face directory"
    )
    save.add_argument("output", type=Path, help="directory to write")
    save.add_argument("--quantize-bits", type=int, choices=[4, 8], help="MLX-quantize first")
    save.add_argument("--group-size", type=int, default=64, help="quantization group size")
    save.add_argument("--max-shard-bytes", type=int, help="shard the weights past this size")
    save.set_defaults(handler=_save_model)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    try:
        args = setup_arg_parser().parse_args(argv)
        configure_logging(args.log_format)
        _select_device(args.device)
        return args.handler(args)
    except SystemExit as exit_:  # --help
        return int(exit_.code or 0)
    except _UsageError as error:
        print(error, file=sys.stderr)
        return 2
    except (ModelNotFoundError, FileNotFoundError, RequestRejected, ValueError) as error:
        print(f"qwen3model: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# -- shared ---------------------------------------------------------------------------------


def _select_device(device: str | None) -> None:
    if device == "gpu" and not mx.is_available(mx.gpu):
        raise _UsageError("qwen3model: error: --device gpu, but this MLX build has no GPU")
    if device is not None:
        mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)


def _on_gpu() -> bool:
    return mx.default_device() == mx.gpu


def _stderr() -> Console:
    return Console(stderr=True)


def _load(args: argparse.Namespace, mode: AttentionMode) -> tuple[Qwen3Model, Tokenizer]:
    source = args.model or (DEFAULT_GPU_MODEL if _on_gpu() else DEFAULT_CPU_MODEL)
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
        model, tokenizer = load_model(
            source,
            kernel_backend=args.kernel_backend,
            attention_mode=mode,
            dtype=dtype,
            seed=args.weights_seed,
            on_progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
    log.info(
        "model_loaded",
        source=source,
        dtype=str(model.dtype),
        device=str(mx.default_device()),
        seconds=round(time.perf_counter() - start, 2),
    )
    return model, tokenizer


def _pages_for(batch_size: int, longest: int, page_size: int) -> int:
    return batch_size * -(-longest // page_size)


# -- generate -------------------------------------------------------------------------------


def _generate(args: argparse.Namespace) -> int:
    prompts = list(args.prompts)
    if args.prompt_file is not None:
        if not args.prompt_file.is_file():
            raise FileNotFoundError(f"no prompt file at {args.prompt_file.resolve()}")
        prompts += [line for line in args.prompt_file.read_text().splitlines() if line.strip()]
    if not prompts:
        raise _UsageError("qwen3model generate: error: give a prompt or --prompt-file (see --help)")
    mode = AttentionMode.PAGED
    if args.disable_paged_attention:
        mode = AttentionMode.GATHER
    elif args.dense_baseline:
        mode = AttentionMode.DENSE
    model, tokenizer = _load(args, mode)
    use_template = tokenizer.has_chat_template if args.chat_template is None else args.chat_template
    if use_template and not tokenizer.has_chat_template:
        raise ValueError(f"--chat-template: {args.model} has no chat template")
    prompt_ids = [
        tokenizer.encode(_render(tokenizer, p, args.system, use_template)) for p in prompts
    ]
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
    engine = Engine(
        model,
        num_pages=args.num_pages or _pages_for(min(batch_size, len(prompts)), longest, page_size),
        page_size=page_size,
        max_batch_size=batch_size,
        prefill_step=args.prefill_step or DEFAULT_PREFILL_STEP,
        admission=args.admission,
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
    failed = 0
    start = time.perf_counter()
    while engine.has_unfinished():
        for event in engine.step():
            rid = event.request_id
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
    stats = engine.stats
    seconds = time.perf_counter() - start
    _stderr().print(
        f"[dim]{stats.decode_tokens + len(request_ids)} tokens generated, "
        f"{stats.prefill_tokens} prefilled in {seconds:.1f} s[/dim]"
    )
    return 1 if failed else 0


# -- serve-bench ----------------------------------------------------------------------------


def _serve_bench(args: argparse.Namespace) -> int:
    base = GPU_TRACE if _on_gpu() else CPU_TRACE
    overrides = {
        name: getattr(args, name)
        for name in (
            "num_seqs",
            "min_input_len",
            "max_input_len",
            "min_output_len",
            "max_output_len",
        )
        if getattr(args, name) is not None
    }
    trace = Trace(
        **{**_trace_fields(base), **overrides},
        batch_size=args.batch_size or base.batch_size,
        prefill_step=args.prefill_step or base.prefill_step,
        page_size=args.page_size or base.page_size,
        seed=args.seed,
    )
    if args.warmup < 0:
        raise _UsageError("qwen3model serve-bench: error: --warmup must be >= 0 (see --help)")
    model, _ = _load(args, AttentionMode(args.variants[0]))
    requests = make_requests(trace, model.args.vocab_size)
    warmup_trace = Trace(
        num_seqs=max(args.warmup, 1),
        batch_size=trace.batch_size,
        min_input_len=trace.min_input_len,
        max_input_len=trace.min_input_len,
        min_output_len=4,
        max_output_len=4,
        prefill_step=trace.prefill_step,
        page_size=trace.page_size,
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
            task = progress.add_task(f"{variant:>6}", total=sum(r.max_new_tokens for r in requests))
            if warmup:
                run_variant(model, AttentionMode(variant), trace, warmup, admission=args.admission)
            result = run_variant(
                model,
                AttentionMode(variant),
                trace,
                requests,
                admission=args.admission,
                num_pages=args.num_pages,
                on_token=lambda task=task: progress.advance(task),
            )
            log.info("bench_variant_finished", variant=variant, wall_s=round(result.wall_s, 2))
            results.append(result)
    source = args.model or (DEFAULT_GPU_MODEL if _on_gpu() else DEFAULT_CPU_MODEL)
    title = (
        f"serve-bench: {source} ({model.dtype}, {mx.default_device()}), {trace.num_seqs} requests, "
        f"batch {trace.batch_size}, prompts {trace.min_input_len}-{trace.max_input_len}, "
        f"outputs {trace.min_output_len}-{trace.max_output_len}, page {trace.page_size}"
    )
    render_table(results, title=title)
    if args.json_output is not None:
        context = {"model": source, "dtype": str(model.dtype), "device": str(mx.default_device())}
        context["kernel_backend"] = args.kernel_backend
        write_json(args.json_output, results, trace=trace, context=context)
    return 0


def _trace_fields(trace: Trace) -> dict[str, int]:
    names = ("num_seqs", "min_input_len", "max_input_len", "min_output_len", "max_output_len")
    return {name: getattr(trace, name) for name in names}


# -- save-model -----------------------------------------------------------------------------


def _save_model(args: argparse.Namespace) -> int:
    model, tokenizer = _load(args, AttentionMode.PAGED)
    if args.quantize_bits is not None:
        model.quantize(QuantizationArgs(group_size=args.group_size, bits=args.quantize_bits))
    written = save_pretrained(model, tokenizer, args.output, max_shard_bytes=args.max_shard_bytes)
    print(f"wrote {args.output} ({len(written)} weight file(s), dtype {_dtype_name(model)})")
    return 0


def _dtype_name(model: Qwen3Model) -> str:
    return next(name for name, dtype in DTYPES.items() if dtype == model.dtype)
