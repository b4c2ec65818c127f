"""The command line: one-line errors, help on every flag, generate / serve-bench / save-model."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import mlx.core as mx
import pytest

from qwen3model import Qwen3Model, Tokenizer, commands, load_model
from qwen3model.cli import main, setup_arg_parser
from qwen3model.serving import CPU_TRACE, GPU_TRACE, serve_bench_trace

TINY = ["--model", "synthetic:qwen3-tiny"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_every_flag_has_help() -> None:
    parser = setup_arg_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == {"generate", "serve-bench", "save-model"}
    for name, subparser in commands.choices.items():
        for action in subparser._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


@pytest.mark.parametrize(
    ("argv", "status", "match"),
    [
        (["generate", "--no-such-flag", "hi"], 2, "unrecognized arguments: --no-such-flag"),
        (["generate", "--max-tokens", "many", "hi"], 2, "invalid int value"),
        (["generate", *TINY], 2, "give a prompt or --prompt-file"),
        (["serve-bench", "--variants", "fast"], 2, "invalid choice: 'fast'"),
        (["launch"], 2, "invalid choice: 'launch'"),
        (["generate", "--model", "/no/such/dir", "hi"], 1, "no model directory at /no/such/dir"),
        (["generate", *TINY, "--prompt-file", "/no/such.txt"], 1, "no prompt file at"),
        (["generate", *TINY, "--temperature", "-1", "hi"], 1, "temperature"),
        (["generate", *TINY, "--chat-template", "hi"], 1, "has no chat template"),
        (["generate", "--model", "synthetic:qwen3-9t", "hi"], 1, "unknown synthetic model"),
        (["serve-bench", *TINY, "--min-input-len", "9", "--max-input-len", "3"], 1, "below"),
        (["generate", *TINY, "--kernel-backend", "nope", "hi"], 1, "nope"),
        (["generate", *TINY, "--page-size", "0", "hi"], 2, "--page-size: expected an int >= 1"),
        (["generate", *TINY, "--max-tokens", "0", "hi"], 2, "--max-tokens: expected an int >= 1"),
        (["serve-bench", *TINY, "--warmup", "-1"], 2, "--warmup: expected an int >= 0"),
        (
            ["generate", *TINY, "--overlap-decode", "--admission", "optimistic", "hi"],
            2,
            "--overlap-decode needs --admission reserve",
        ),
        (
            ["save-model", *TINY, "/no/such/out", "--quantize-bits", "4", "--group-size", "128"],
            1,
            "divisible by the quantization group size 128",
        ),
        (
            ["generate", *TINY, "--compile-decode", "--dense-baseline", "hi"],
            2,
            "--compile-decode compiles paged decode steps",
        ),
        (
            ["generate", *TINY, "--system", "be brief", "--no-chat-template", "hi"],
            2,
            "--system goes into the chat template",
        ),
        (["generate", *TINY, "--system", "be brief", "hi"], 1, "--system: this model's tokenizer"),
    ],
    ids=[
        "unknown-flag",
        "bad-int",
        "no-prompt",
        "bad-variant",
        "bad-command",
        "missing-model",
        "missing-prompt-file",
        "bad-sampling",
        "no-template",
        "bad-synthetic",
        "bad-trace",
        "bad-backend",
        "zero-page-size",
        "zero-max-tokens",
        "negative-warmup",
        "overlap-optimistic",
        "group-size-does-not-divide",
        "compile-with-ablation",
        "system-without-template",
        "system-but-no-template",
    ],
)
def test_errors_are_one_line(capsys, argv: list[str], status: int, match: str) -> None:
    got, out, err = run(capsys, *argv)
    assert got == status
    assert match in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and out == ""


def test_internal_errors_keep_their_traceback(monkeypatch) -> None:
    def bug(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr(commands, "_stream_outputs", bug)
    with pytest.raises(ValueError, match="an internal bug"):
        main(["generate", *TINY, "--max-tokens", "2", "hi"])


def test_help_exits_cleanly(capsys) -> None:
    status, out, _ = run(capsys, "serve-bench", "--help")
    assert status == 0
    assert "--disable-paged-attention" not in out and "--variants" in out


def test_device_gpu_runs_there_or_is_a_clear_error(capsys) -> None:
    status, out, err = run(capsys, "generate", *TINY, "--device", "gpu", "--max-tokens", "3", "hi")
    if mx.is_available(mx.gpu):
        assert status == 0 and out, err
    else:
        assert status == 2 and "no GPU" in err and out == ""


def test_generate_streams_deterministic_text(capsys) -> None:
    argv = ["generate", *TINY, "--max-tokens", "12", "--ignore-eos", "Hello"]
    status, first, _ = run(capsys, *argv)
    assert status == 0
    _, second, _ = run(capsys, *argv)
    assert first == second and first.endswith("\n") and len(first) > 1


@pytest.mark.parametrize(
    "flag", ["--disable-paged-attention", "--dense-baseline", "--compile-decode"]
)
def test_ablations_and_compile_keep_the_greedy_text(capsys, flag: str) -> None:
    argv = ["generate", *TINY, "--max-tokens", "16", "--ignore-eos", "Paged or not"]
    _, paged, _ = run(capsys, *argv)
    status, ablation, _ = run(capsys, *argv, flag)
    assert status == 0 and ablation == paged


def test_several_prompts_print_one_block_each(capsys, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first prompt\n\nsecond prompt\n")
    status, out, _ = run(
        capsys, "generate", *TINY, "--max-tokens", "5", "--prompt-file", str(prompts), "third"
    )
    assert status == 0
    assert [line for line in out.splitlines() if line.startswith("--- request")] == [
        f"--- request {i} (length) ---" for i in range(3)
    ]


def test_generate_counts_the_tokens_it_generated(capsys, monkeypatch) -> None:
    step = Qwen3Model.step

    def failing_prefill(self, tokens, metadata, kv):  # fails the 7-token prompt's prefill
        if tokens.shape[1] == 7:
            raise RuntimeError("injected failure")
        return step(self, tokens, metadata, kv)

    monkeypatch.setattr(Qwen3Model, "step", failing_prefill)
    argv = ["generate", *TINY, "--max-tokens", "5", "--ignore-eos", "first", "seventh", "third"]
    status, out, err = run(capsys, *argv)
    assert status == 1 and "injected failure" in err
    assert "10 tokens generated" in err  # two requests of 5; the failed one generated none
    assert out.count("(length)") == 2 and "(failed)" in out


def test_save_model_then_generate_from_the_directory(capsys, tmp_path: Path) -> None:
    status, out, _ = run(capsys, "save-model", *TINY, str(tmp_path / "tiny"))
    assert status == 0 and "wrote" in out
    argv = ["--max-tokens", "10", "--ignore-eos", "same weights"]
    _, from_dir, _ = run(capsys, "generate", "--model", str(tmp_path / "tiny"), *argv)
    _, synthetic, _ = run(capsys, "generate", *TINY, *argv)
    assert from_dir == synthetic


def test_save_model_quantized_and_sharded(capsys, tmp_path: Path) -> None:
    target = tmp_path / "q8"
    argv = ["save-model", *TINY, str(target), "--quantize-bits", "8", "--group-size", "32"]
    status, _, _ = run(capsys, *argv, "--max-shard-bytes", "30000")
    assert status == 0
    config = json.loads((target / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 8}
    assert (target / "model.safetensors.index.json").is_file()
    model, _ = load_model(str(target))
    assert model.args.quantization is not None


def test_chat_template_is_applied_by_default(capsys, tmp_path: Path) -> None:
    target = tmp_path / "chat"
    run(capsys, "save-model", *TINY, str(target))
    tokenizer = Tokenizer.from_directory(target)
    tokenizer.chat_template = "<|im_start|>{{ messages[-1]['content'] }}<|im_end|>"
    tokenizer.save(target)
    argv = ["generate", "--model", str(target), "--max-tokens", "8", "--ignore-eos", "hi"]
    _, templated, _ = run(capsys, *argv)
    _, raw, _ = run(capsys, *argv, "--no-chat-template")
    _, raw_prompt, _ = run(capsys, *argv[:-1], "--no-chat-template", "<|im_start|>hi<|im_end|>")
    assert templated != raw and templated == raw_prompt


def serve_bench(capsys, tmp_path: Path, *flags: str) -> tuple[str, dict]:
    """Runs serve-bench on the tiny model; returns the printed table and the JSON document
    (written into a folder that does not exist yet: serve-bench makes it)."""
    out_json = tmp_path / "results" / "bench.json"
    status, out, err = run(capsys, "serve-bench", *TINY, *flags, "--json-output", str(out_json))
    assert status == 0, err
    return out, json.loads(out_json.read_text())


def test_serve_bench_reports_every_variant(capsys, tmp_path: Path) -> None:
    out, document = serve_bench(
        capsys,
        tmp_path,
        "--num-seqs", "5", "--batch-size", "2",
        "--min-input-len", "20", "--max-input-len", "70",
        "--min-output-len", "3", "--max-output-len", "9",
        "--prefill-step", "32", "--page-size", "8",
    )  # fmt: skip
    for text in ("dense", "gather", "paged", "decode tok/s", "bytes not copied vs dense"):
        assert text in out
    results = {r["variant"]: r for r in document["results"]}
    assert document["trace"]["num_seqs"] == 5
    assert results["paged"]["copied_bytes"] == 0
    assert results["dense"]["copied_bytes"] > 0 and results["gather"]["copied_bytes"] > 0
    assert results["paged"]["output_tokens"] == results["dense"]["output_tokens"] >= 15
    assert results["paged"]["pages_reused"] > 0
    assert results["dense"]["peak_kv_bytes"] > 0 and results["paged"]["peak_kv_bytes"] > 0
    for result in results.values():  # batch 2: at most 2 requests decode at once
        assert result["peak_decode_rows"] == 2 and 1 < result["mean_decode_rows"] <= 2
        # A step's period holds its synchronised call and the engine's work around it.
        assert result["decode_period_ms"][0] > result["decode_step_ms"][0] > 0
    context = document["context"]
    assert context["compile_decode"] is False and context["admission"] == "reserve"
    assert context["page_size"] == 8 and context["num_pages"] == 2 * 10  # 79 tokens: 10 pages
    assert "provenance" not in context  # top level, as in every results JSON
    assert document["provenance"]["mlx_version"] == mx.__version__
    assert document["provenance"]["device"] == context["device"]


def test_serve_bench_labels_compiled_decode_and_records_the_engine(capsys, tmp_path: Path) -> None:
    out, document = serve_bench(
        capsys,
        tmp_path,
        "--variants", "paged", "gather", "--compile-decode",
        "--num-seqs", "3", "--batch-size", "1", "--num-pages", "40",
        "--admission", "optimistic",
        "--min-input-len", "10", "--max-input-len", "20",
        "--min-output-len", "2", "--max-output-len", "4",
    )  # fmt: skip
    assert "paged+compile" in out
    assert [r["variant"] for r in document["results"]] == ["paged+compile", "gather"]
    for result in document["results"]:  # batch 1: exactly one request per decode call
        assert result["peak_decode_rows"] == 1 and result["mean_decode_rows"] == 1.0
    context = document["context"]
    assert context["compile_decode"] is True and context["num_pages"] == 40
    assert context["admission"] == "optimistic"


def test_serve_bench_overlapped_decode_is_labelled_and_timed_by_period(
    capsys, tmp_path: Path
) -> None:
    out, document = serve_bench(
        capsys,
        tmp_path,
        "--variants", "paged", "--compile-decode", "--overlap-decode",
        "--num-seqs", "3", "--batch-size", "2",
        "--min-input-len", "10", "--max-input-len", "20",
        "--min-output-len", "6", "--max-output-len", "9",
    )  # fmt: skip
    assert "paged+compile+overlap" in out and "decode step period ms median" in out
    [result] = document["results"]
    assert result["variant"] == "paged+compile+overlap"
    assert result["decode_step_ms"] == result["decode_period_ms"]  # its decode steps: periods
    assert result["decode_period_ms"][0] > 0 and result["output_tokens"] >= 18
    assert document["context"]["overlap_decode"] is True


def test_serve_bench_trace_applies_only_the_given_overrides() -> None:
    trace = serve_bench_trace(on_gpu=False, seed=3, num_seqs=2, page_size=None)
    assert trace == dataclasses.replace(CPU_TRACE, num_seqs=2, seed=3)
    assert serve_bench_trace(on_gpu=True) == GPU_TRACE
    with pytest.raises(TypeError, match="num_requests"):
        serve_bench_trace(on_gpu=True, num_requests=3)
