"""``bench`` output: the same tables for a terminal (rich) and for ``results/bench.md`` (Markdown), and the
scaling figure."""

from __future__ import annotations

from pathlib import Path

from gspo_bench import tables

# The reference point: a widely used GRPO implementation on transformers' generate, cpu-bench
# configuration, measured on a 2-core machine of this kind.
REFERENCE = {"completions_per_s": 52.0, "gen_tokens_per_s": 2000.0, "seconds": 2.5}
TARGETS = {"rl_step_vs_reference": 3.0, "generation_vs_generate": 2.0}


def sections(d: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, columns, rows) for every section of one bench result (``BenchResult.to_dict()``)."""
    out = []
    peak = d["matmul_gflops"]
    gen = d["generation"]
    rows = [[k, f"{v['seconds']:.3f}", f"{v['tokens']:.0f}", f"{v['tokens_per_s']:.0f}", f"{v['completions_per_s']:.0f}"]
            for k, v in gen.items() if isinstance(v, dict)]
    title = "(a) rollout generation, one batch"
    if "speedup" in gen:
        title += f": fast engine {gen['speedup']:.2f}x model.generate (target >= {TARGETS['generation_vs_generate']:.0f}x)"
    if "compiled_speedup" in gen:
        title += (f"; compiled decode steps {gen['compiled_speedup']:.2f}x (compiling took "
                  f"{gen['compiled']['compile_s']:.1f} s, in the warm-up)")
    out.append((title, ["engine", "s / rollout", "tokens", "tokens/s", "completions/s"], rows))
    tr = d["training"]
    rows = [[k, f"{v['seconds']:.3f}", f"{v['tokens']:.0f} ({v['padded_tokens']:.0f} padded)", f"{v['tokens_per_s']:.0f}",
             f"{v['mfu']:.1%}"] for k, v in tr.items() if isinstance(v, dict)]
    title = "(b) training: forward + backward + AdamW over one rollout, all minibatches"
    if "speedup" in tr:
        title += f": packed {tr['speedup']:.2f}x transformers"
    out.append((title, ["forward", "s / rollout", "real tokens", "tokens/s", "MFU"], rows))
    rl = d["rl_step"]
    comparable = d["config"].get("reference_comparable", False)
    rows = [[k, v["engine"], v["old_logp_source"], f"{v['seconds']:.3f}", f"{v['completions_per_s']:.0f}",
             f"{v['gen_tokens_per_s']:.0f}", f"{v['gen_s']:.3f}", f"{v['train_s']:.3f}",
             f"{v['completions_per_s'] / REFERENCE['completions_per_s']:.2f}x" if comparable else "-",
             f"{v['mfu']:.1%}"]
            for k, v in rl.items() if isinstance(v, dict)]
    title = f"(c) full RL step ({d['config']['algo']}), median of {next(iter(rl.values()))['steps']} after warm-up"
    if "speedup" in rl:
        title += f": fast path {rl['speedup']:.2f}x transformers path"
    if comparable:
        title += (f"; reference {REFERENCE['completions_per_s']:.0f} completions/s, target >= "
                  f"{TARGETS['rl_step_vs_reference'] * REFERENCE['completions_per_s']:.0f}")
    out.append((title, ["path", "engine", "old logp", "s / step", "completions/s", "gen tokens/s", "gen s", "train s",
                        "x reference", "MFU"], rows))
    where = d.get("device", "cpu")
    where = f"{d['config']['threads']} threads" if where == "cpu" else where
    out.append((f"(d) machine: {d.get('matmul_dtype', 'float32')} matmul {peak:.0f} GFLOP/s measured ({where}); "
                "MFU = model FLOPs / time / that", ["machine", "params", "active matmul params"],
                [[d["machine"], f"{d['params']:,}", f"{d['active_matmul_params']:,}"]]))
    if d["scaling"]:
        base = d["scaling"][0]
        rows = [[str(s["max_new_tokens"]), s["engine"], f"{s['seconds']:.3f}", f"{s['tokens']:.0f}",
                 f"{s['seconds'] / base['seconds']:.2f}x", f"{s['max_new_tokens'] / base['max_new_tokens']:.2f}x",
                 f"{s['seconds_per_1k_tokens'] * 1000:.0f}"] for s in d["scaling"]]
        out.append(("scaling: time per rollout against max_new_tokens (linear = time grows no faster than the cap)",
                    ["max_new_tokens", "engine", "s / rollout", "tokens", "time vs first", "cap vs first",
                     "ms / 1k tokens"], rows))
    return out


def rich_tables(d: dict):
    from rich.table import Table

    for title, cols, rows in sections(d):
        t = Table(title=title, title_justify="left")
        for c in cols:
            t.add_column(c)
        for r in rows:
            t.add_row(*r)
        yield t


def markdown(d: dict, command: str, commit: str, figure: str | None = None) -> str:
    lines = [f"# bench: {d['model']} on {d['config']['task']}", "",
             f"Made by `{command}` at commit `{commit}` on {d['machine']}.",
             f"Configuration: {d['config']['prompts']} prompts x {d['config']['group_size']} samples, temperature "
             f"{d['config']['temperature']}, at most {d['config']['max_new_tokens']} new tokens, "
             f"{d['config']['minibatches']} minibatches, algorithm {d['config']['algo']}.", ""]
    for title, cols, rows in sections(d):
        lines += [f"**{title}**", "", tables.markdown(cols, rows)]
    if figure:
        lines += [f"![rollout time against max_new_tokens]({figure})", ""]
    for n in d.get("notes", []):
        lines.append(f"- {n}")
    return "\n".join(lines).rstrip() + "\n"


def plot_scaling(results: list[dict], path: str | Path) -> Path:
    """Rollout seconds against max_new_tokens, one line per model, with the linear extrapolation of the first point."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, d in enumerate(results):
        xs = [s["max_new_tokens"] for s in d["scaling"]]
        ys = [s["seconds"] for s in d["scaling"]]
        line, = ax.plot(xs, ys, "o-", label=f"{d['model']} ({d['scaling'][0]['engine']} engine)")
        ax.plot(xs, [ys[0] * x / xs[0] for x in xs], ":", color=line.get_color(), alpha=0.7,
                label=f"{d['model']}: linear from {xs[0]}")
    ax.set_xlabel("max_new_tokens")
    ax.set_ylabel("seconds per rollout (128 completions)")
    ax.set_title("Rollout time against the length cap (below the dotted line = sublinear)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
