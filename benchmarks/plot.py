"""Results JSON -> PNG plots (matplotlib, Agg backend: no display needed).

Understands the five kinds of results this repository writes:
- `benchmarks/attention.py`: decode latency and K/V bandwidth against context for every path (one
  panel per batch x page size), prefill latency, and `write_kv` against the copy-then-scatter;
- `qwen3model serve-bench --json-output`: throughput and memory per variant;
- `benchmarks/admission_sweep.py`: concurrency and throughput against the KV budget;
- `benchmarks/decode_step.py`: one decode step per results file (one commit each), its wall
  time against its host share and GPU time, and the GPU time by kind of kernel;
- `benchmarks/kernel_time.py`: GPU latency per decode call against context, per path and page
  size (one panel per batch).

    .venv/bin/python benchmarks/plot.py out/attention.json out/serving.json --output-dir out/plots
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

__all__ = ["detect_kind", "plot_files"]

PATH_STYLE = {
    "dense": dict(color="tab:orange", marker="s", label="dense (gather + dense attention)"),
    "gather": dict(color="tab:orange", marker="x", linestyle=":", label="gather alone"),
    "paged": dict(color="tab:blue", marker="o", label="paged (direct)"),
    "sdpa": dict(color="tab:green", marker="^", label="MLX SDPA (pre-gathered)"),
}
H200_COPY_GBPS = 4300.0  # measured device-to-device copy (shared/device/README.md)


def detect_kind(document: dict) -> str:
    """ "attention", "admission_sweep", "decode_step", "kernel_time" or "serving" (serve-bench
    has no `kind` field)."""
    if document.get("kind") in ("attention", "admission_sweep", "decode_step", "kernel_time"):
        return document["kind"]
    if "results" in document and "trace" in document:
        return "serving"
    raise ValueError(
        f"unrecognised results JSON (top-level keys {sorted(document)}); expected the output of "
        "benchmarks/attention.py, benchmarks/admission_sweep.py, benchmarks/decode_step.py, "
        "benchmarks/kernel_time.py or qwen3model serve-bench"
    )


def _subtitle(document: dict) -> str:
    prov = document.get("provenance", {})
    gpu = (prov.get("gpu") or {}).get("name") if isinstance(prov.get("gpu"), dict) else None
    where = gpu or prov.get("cpu") or prov.get("device", "")
    sha = (prov.get("commit") or {}).get("sha") or ""
    return f"{where}, MLX {prov.get('mlx_version', '?')}, {sha[:10]}".strip(", ")


def _panels(n: int, *, ncols: int) -> tuple[plt.Figure, list[plt.Axes]]:
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _save(fig: plt.Figure, path: Path, title: str) -> Path:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _attention_curves(document: dict, out: Path, stem: str) -> list[Path]:
    cells = [c for c in document["cells"] if c["status"] == "ok" and c["path"] in PATH_STYLE]
    decode = [c for c in cells if c["shape"]["query_len"] == 1]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for cell in decode:
        groups[(cell["shape"]["batch"], cell["shape"]["page_size"], cell["shape"]["dtype"])].append(
            cell
        )
    written = []
    ceiling = H200_COPY_GBPS if document["provenance"].get("device") == "gpu" else None
    for metric, ylabel, suffix in (
        ("median_us", "us per call", "latency"),
        ("kv_gbps", "K+V GB/s read", "bandwidth"),
    ):
        if not groups:
            break
        fig, axes = _panels(len(groups), ncols=3)
        for ax, (key, group) in zip(axes, sorted(groups.items()), strict=True):
            for path, style in PATH_STYLE.items():
                points = sorted((c["shape"]["context"], c) for c in group if c["path"] == path)
                points = [(x, c) for x, c in points if metric in c]
                if not points:
                    continue
                xs = [x for x, _ in points]
                ys = [c[metric] for _, c in points]
                ax.plot(xs, ys, **style)
            if metric == "kv_gbps" and ceiling:
                ax.axhline(
                    ceiling, color="gray", linestyle="--", linewidth=0.8, label="H200 copy ceiling"
                )
            contexts = sorted({c["shape"]["context"] for c in group})
            ax.set_xscale("log", base=2)
            ax.set_xticks(contexts, [str(x) for x in contexts])
            ax.set(
                yscale="log",
                xlabel="context (tokens)",
                ylabel=ylabel,
                title=f"B={key[0]}, page {key[1]}, {key[2]}",
            )
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=7)
        heads = document["config"]
        title = (
            f"decode attention {suffix} (Hq {heads['heads_q']} / Hkv {heads['heads_kv']} / "
            f"D {heads['head_dim']}) - {_subtitle(document)}"
        )
        written.append(_save(fig, out / f"{stem}-decode-{suffix}.png", title))
    return written


def _kernel_time(document: dict, out: Path, stem: str) -> list[Path]:
    batches = sorted({r["shape"]["batch"] for r in document["results"]})
    fig, axes = _panels(len(batches), ncols=3)
    for ax, batch in zip(axes, batches, strict=True):
        rows = [r for r in document["results"] if r["shape"]["batch"] == batch]
        smallest_page = min(r["shape"]["page_size"] for r in rows)  # solid; larger ones dashed
        for path, page_size in sorted({(r["path"], r["shape"]["page_size"]) for r in rows}):
            points = sorted(
                (r["shape"]["context"], r["median_kernel_us"])
                for r in rows
                if r["path"] == path and r["shape"]["page_size"] == page_size
            )
            style = dict(PATH_STYLE[path], label=f"{PATH_STYLE[path]['label']}, page {page_size}")
            if page_size != smallest_page:
                style.update(linestyle="--", markerfacecolor="none")
            ax.plot([x for x, _ in points], [y for _, y in points], **style)
        contexts = sorted({r["shape"]["context"] for r in rows})
        ax.set_xscale("log", base=2)
        ax.set_xticks(contexts, [str(x) for x in contexts])
        ax.set(
            yscale="log", xlabel="context (tokens)", ylabel="GPU us per call", title=f"B={batch}"
        )
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    splits = document.get("decode_splits", 0)
    chunks = f"{splits} key chunks" if splits else "the planner's key chunks"
    title = f"decode latency, chained calls, {chunks} - {_subtitle(document)}"
    return [_save(fig, out / f"{stem}-latency.png", title)]


def _attention_bars(document: dict, out: Path, stem: str) -> list[Path]:
    """Prefill latency per path and write_kv against the copy-then-scatter, as grouped bars."""
    written = []
    cells = [c for c in document["cells"] if c["status"] == "ok"]
    for name, paths, keep in (
        ("prefill", ("dense", "paged", "sdpa"), lambda s: s["query_len"] > 1),
        ("write-kv", ("write", "write_functional"), lambda s: True),
    ):
        chosen = [c for c in cells if c["path"] in paths and keep(c["shape"])]
        if not chosen:
            continue
        paths = [path for path in paths if any(c["path"] == path for c in chosen)]
        labels = sorted({c["label"] for c in chosen}, key=lambda s: [len(s), s])
        fig, (ax,) = _panels(1, ncols=1)
        fig.set_size_inches(max(6.0, 1.1 * len(labels) * len(paths)), 4.0)
        width = 0.8 / len(paths)
        for i, path in enumerate(paths):
            times = {c["label"]: c["median_us"] for c in chosen if c["path"] == path}
            xs = [j + i * width for j, label in enumerate(labels) if label in times]
            bars = ax.bar(
                xs,
                [times[label] for label in labels if label in times],
                width,
                label=path,
                color=PATH_STYLE.get(path, {}).get("color"),
            )
            ax.bar_label(bars, fmt="%.4g", fontsize=6)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))])
        ax.set_xticklabels([label.replace(" ", "\n", 4) for label in labels], fontsize=7)
        spread = max(c["median_us"] for c in chosen) / min(c["median_us"] for c in chosen)
        ax.set(yscale="log" if spread > 30 else "linear", ylabel="us per call")
        ax.legend(fontsize=8)
        written.append(_save(fig, out / f"{stem}-{name}.png", f"{name} - {_subtitle(document)}"))
    return written


def _serving(documents: list[dict], out: Path, stem: str) -> list[Path]:
    """Throughput and K/V memory per variant, all serving files' variants side by side."""
    results = [r for d in documents for r in d["results"]]
    variants = [textwrap.fill(r["variant"], 14) for r in results]
    fig, (left, right) = _panels(2, ncols=2)
    fig.set_size_inches(max(9.0, 2.2 * len(results)), 4.0)
    metrics = ("prefill_tokens_per_s", "decode_tokens_per_s", "output_tokens_per_s")
    width = 0.8 / len(metrics)
    for i, metric in enumerate(metrics):
        bars = left.bar(
            [j + i * width for j in range(len(results))],
            [r[metric] for r in results],
            width,
            label=metric.replace("_", " "),
        )
        left.bar_label(bars, fmt="%.4g", fontsize=6)
    left.set_xticks([j + width for j in range(len(results))], variants, fontsize=7)
    left.set(yscale="log", ylabel="tokens / s", title="throughput")
    left.legend(fontsize=7)
    for i, metric in enumerate(("peak_kv_bytes", "copied_bytes")):
        # mlx-lm reports no copy volume (None): drawn as a missing bar, not as zero.
        present = [(j, r[metric]) for j, r in enumerate(results) if r.get(metric) is not None]
        right.bar(
            [j + i * 0.4 for j, _ in present],
            [value / 2**20 for _, value in present],
            0.4,
            label=metric.replace("_", " "),
        )
    right.set_xticks([j + 0.2 for j in range(len(results))], variants, fontsize=7)
    right.set(ylabel="MiB", title="K/V memory: peak and bytes copied")
    right.legend(fontsize=7)
    trace = documents[0]["trace"]
    models = sorted({d.get("context", {}).get("model", "") for d in documents})
    title = (
        f"serving {', '.join(models)}: {trace['num_seqs']} requests, batch {trace['batch_size']}, "
        f"prefill step {trace['prefill_step']}"
    )
    return [_save(fig, out / f"{stem}-serving.png", title)]


# Kernel name fragment -> the family a decode step's GPU time is reported under (first match).
KERNEL_FAMILIES = (
    ("linear_kernel", "projections"),
    ("gemm", "projections"),  # mx.matmul's cuBLAS / CUTLASS kernels
    ("gemv", "projections"),
    ("attention", "attention + merge"),
    ("merge_splits", "attention + merge"),
    ("rms_norm", "norms + RoPE"),
    ("rope", "norms + RoPE"),
    ("decode_qkv", "norms + RoPE + K/V write"),  # q/k norm + RoPE and write_kv in one kernel
    ("write_kv", "write_kv"),
    ("silu", "SwiGLU"),
    ("Sigmoid", "SwiGLU"),  # MLX's compiled silu(gate) * up
)


def _kernel_family(name: str) -> str:
    return next((family for part, family in KERNEL_FAMILIES if part in name), "other")


def _decode_steps(documents: list[dict], out: Path, stem: str) -> list[Path]:
    """The compiled step's wall time, host share and GPU time per file, and its GPU time by
    kernel family (files without `--kernel-trace` show their wall times only)."""
    shapes = {json.dumps(d["shape"], sort_keys=True) for d in documents}
    if len(shapes) > 1:
        raise ValueError(f"decode-step files of different shapes cannot share a figure: {shapes}")
    labels = [(d["provenance"].get("commit") or {}).get("sha", "?")[:7] for d in documents]
    fig, (left, right) = _panels(2, ncols=2)
    fig.set_size_inches(max(9.0, 2.4 * len(documents)), 4.0)
    series = {
        "step (compiled)": [d["median_ms"].get("step+compile") for d in documents],
        "step (compiled, overlapped)": [
            d["median_ms"].get("step+compile overlapped") for d in documents
        ],
        "host share": [d["median_ms"].get("step+compile host") for d in documents],
        "GPU time": [
            d["kernel_trace"]["kernel_us_per_step"] / 1000 if d.get("kernel_trace") else None
            for d in documents
        ],
    }
    series = {name: values for name, values in series.items() if any(v is not None for v in values)}
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        present = [(j, v) for j, v in enumerate(values) if v is not None]
        bars = left.bar([j + i * width for j, _ in present], [v for _, v in present], width)
        bars.set_label(name)
        left.bar_label(bars, fmt="%.2f", fontsize=6)
    left.axhline(documents[0]["weight_floor_ms"], color="gray", linestyle="--", linewidth=1,
                 label="weight-streaming floor")  # fmt: skip
    left.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(documents))], labels,
                    fontsize=7)  # fmt: skip
    left.set(ylabel="ms", title="decode step: wall, host, GPU")
    left.set_ylim(top=1.35 * max(v for values in series.values() for v in values if v))
    left.legend(fontsize=7, loc="upper left", ncols=2)
    families: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(documents))
    for j, document in enumerate(documents):
        for kernel in (document.get("kernel_trace") or {}).get("kernels", []):
            families[_kernel_family(kernel["kernel"])][j] += kernel["us"] / 1000
    bottom = [0.0] * len(documents)
    for family, values in families.items():
        right.bar(range(len(documents)), values, 0.6, bottom=bottom, label=family)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set_xticks(range(len(documents)), labels, fontsize=7)
    right.set(ylabel="GPU ms per step", title="GPU time by kernel family")
    right.legend(fontsize=7)
    shape = documents[0]["shape"]
    title = (
        f"decode step {shape['model']} {shape['dtype']}, batch {shape['batch']} at "
        f"{shape['context']} tokens - {_subtitle(documents[-1])}"
    )
    return [_save(fig, out / f"{stem}-decode-step.png", title)]


def _peak_decode_rows(row: dict) -> int:
    # Schema 1 sweeps measured concurrency beside the result; schema 2 results carry it.
    return row["result"].get("peak_decode_rows", row.get("peak_decode_rows"))


def _admission(document: dict, out: Path, stem: str) -> list[Path]:
    series: dict[str, list[dict]] = defaultdict(list)
    for row in document["rows"]:
        if row["status"] == "ok":
            series[f"{row['variant']}/{row['policy']}"].append(row)
    fig, (left, right) = _panels(2, ncols=2)
    for name, rows in sorted(series.items()):
        rows.sort(key=lambda r: r["budget_pages"])
        budget_mib = [r["budget_bytes"] / 2**20 for r in rows]
        left.plot(budget_mib, [_peak_decode_rows(r) for r in rows], marker="o", label=name)
        right.plot(
            budget_mib, [r["result"]["output_tokens_per_s"] for r in rows], marker="o", label=name
        )
    left.set(xlabel="KV budget (MiB)", ylabel="peak concurrent decode rows", title="concurrency")
    right.set(xlabel="KV budget (MiB)", ylabel="output tokens / s", title="throughput")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    title = f"admission sweep ({document['model']['source']}) - {_subtitle(document)}"
    return [_save(fig, out / f"{stem}-admission.png", title)]


def plot_files(paths: list[Path], output_dir: Path) -> list[Path]:
    """Writes every plot the results files support; returns the PNG paths.

    Serving files (serve-bench, mlx_lm_reference) are drawn together in one figure, named after
    the first of them, and so are decode-step files, in the order given; attention, admission
    and kernel-time files get their own figures each.
    """
    documents = [(path, json.loads(path.read_text())) for path in paths]
    output_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    serving, decode_steps = [], []
    for path, document in documents:
        kind = detect_kind(document)
        if kind == "attention":
            written += _attention_curves(document, output_dir, path.stem)
            written += _attention_bars(document, output_dir, path.stem)
        elif kind == "admission_sweep":
            written += _admission(document, output_dir, path.stem)
        elif kind == "decode_step":
            decode_steps.append((path, document))
        elif kind == "kernel_time":
            written += _kernel_time(document, output_dir, path.stem)
        else:
            serving.append((path, document))
    if serving:
        written += _serving([d for _, d in serving], output_dir, serving[0][0].stem)
    if decode_steps:
        written += _decode_steps([d for _, d in decode_steps], output_dir, decode_steps[0][0].stem)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="results JSON files")
    parser.add_argument("--output-dir", type=Path, default=Path("plots"))
    args = parser.parse_args(argv)
    missing = [path for path in args.results if not path.is_file()]
    for path in missing:
        print(f"plot.py: no results file at {path}; skipped", file=sys.stderr)
    present = [path for path in args.results if path.is_file()]
    for png in plot_files(present, args.output_dir):
        print(png)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
