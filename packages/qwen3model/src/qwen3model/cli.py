"""The `qwen3model` command line: `generate`, `serve-bench` and `save-model`.

`main(argv)` returns an exit status (0 ok, 1 failed, 2 bad usage) so tests can call it; errors
the user can fix are one line on stderr, never a traceback. Anything else (a bug) propagates
with its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from pageruntime import RequestRejected
from pageruntime.logging import configure_logging
from qwen3model import commands as cmd
from qwen3model.attention import AttentionMode
from qwen3model.loading import DTYPES, ModelNotFoundError

__all__ = ["main", "setup_arg_parser"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise cmd.UsageError(f"{self.prog}: error: {message} (see --help)")


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type` accepting ints >= `minimum` (others are usage errors, status 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, got {value}")
        return value

    return parse


_POSITIVE = _int_at_least(1)


def setup_arg_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (flags in kebab case, each with help)."""
    parser = _Parser(prog="qwen3model", description="Qwen3 on a paged-attention MLX runtime.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    common = _Parser(add_help=False)
    common.add_argument(
        "--model",
        help="HF model directory, hub id (Qwen/Qwen3-0.6B) or synthetic:qwen3-{tiny,small,0.6b,4b} "
        f"(default: {cmd.DEFAULT_GPU_MODEL} on GPU, {cmd.DEFAULT_CPU_MODEL} on CPU)",
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
    engine.add_argument("--page-size", type=_POSITIVE, help="tokens per KV page")
    engine.add_argument(
        "--num-pages", type=_POSITIVE, help="KV pool capacity (default: fits the batch)"
    )
    engine.add_argument("--batch-size", type=_POSITIVE, help="most requests at once")
    engine.add_argument("--prefill-step", type=_POSITIVE, help="prefill chunk in tokens")
    engine.add_argument(
        "--compile-decode",
        action="store_true",
        help="run paged decode steps through mx.compile (one trace per batch/width bucket)",
    )
    engine.add_argument(
        "--admission",
        choices=["reserve", "optimistic"],
        default="reserve",
        help="reserve prompt+max tokens up front, or admit on prompt and preempt when full",
    )
    engine.add_argument(
        "--overlap-decode",
        action="store_true",
        help="launch the next decode step before waiting for this one (host work overlaps "
        "the device; reserve admission only)",
    )

    generate = subparsers.add_parser(
        "generate", parents=[common, engine], help="generate text for one or more prompts"
    )
    generate.add_argument("prompts", nargs="*", help="prompts (each one a request)")
    generate.add_argument("--prompt-file", type=Path, help="a file with one prompt per line")
    generate.add_argument(
        "--max-tokens", type=_POSITIVE, default=cmd.DEFAULT_MAX_TOKENS, help="tokens per prompt"
    )
    generate.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    generate.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    generate.add_argument(
        "--top-k", type=_int_at_least(0), default=0, help="keep the k best tokens (0: all)"
    )
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
    generate.set_defaults(handler=cmd.generate)

    bench = subparsers.add_parser(
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
        default = f"{getattr(cmd.GPU_TRACE, name.replace('-', '_'))} on GPU, "
        default += f"{getattr(cmd.CPU_TRACE, name.replace('-', '_'))} on CPU"
        bench.add_argument(f"--{name}", type=_POSITIVE, help=f"{help_text} (default: {default})")
    bench.add_argument("--seed", type=int, default=0, help="seed of lengths and prompt tokens")
    bench.add_argument(
        "--warmup", type=_int_at_least(0), default=1, help="warm-up requests per variant"
    )
    bench.add_argument("--json-output", type=Path, help="also write the results as JSON here")
    bench.set_defaults(handler=cmd.serve_bench)

    save = subparsers.add_parser(
        "save-model", parents=[common], help="write a model as a Hugging Face directory"
    )
    save.add_argument("output", type=Path, help="directory to write")
    save.add_argument("--quantize-bits", type=int, choices=[4, 8], help="MLX-quantize first")
    save.add_argument(
        "--group-size", type=int, choices=[32, 64, 128], default=64, help="quantization group size"
    )
    save.add_argument("--max-shard-bytes", type=_POSITIVE, help="shard the weights past this size")
    save.set_defaults(handler=cmd.save_model)
    return parser


def _check_combinations(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Rejects flags that parse alone but contradict each other (argparse exits with 2)."""
    if getattr(args, "overlap_decode", False) and args.admission != "reserve":
        parser.error("--overlap-decode needs --admission reserve")
    if args.command != "generate":
        return
    if args.compile_decode and (args.disable_paged_attention or args.dense_baseline):
        parser.error("--compile-decode compiles paged decode steps: drop the ablation")
    if args.system is not None and args.chat_template is False:
        parser.error("--system goes into the chat template: drop --no-chat-template")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    try:
        parser = setup_arg_parser()
        args = parser.parse_args(argv)
        _check_combinations(parser, args)
        configure_logging(args.log_format)
        cmd.select_device(args.device)
        return args.handler(args)
    except SystemExit as exit_:  # --help
        return int(exit_.code or 0)
    except cmd.UsageError as error:
        print(error, file=sys.stderr)
        return 2
    except (cmd.InputError, ModelNotFoundError, FileNotFoundError, RequestRejected) as error:
        print(f"qwen3model: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
