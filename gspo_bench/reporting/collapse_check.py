"""``collapse-check``: replay the collapse detector over recorded runs, and keep their histories as test data.

A detector is only as good as its record on real runs. This reads the
metric histories of finished runs back from MLflow (or from a JSON file
written by ``--export``), feeds them step by step to a fresh
``CollapseDetector`` (training metrics through ``update``, each evaluation
through ``update_eval``, in the order a live run sees them) and reports the
events it opens, next to what a reader judges from the curves (eval pass@1
from the warm start to the end). ``tests/test_collapse_check.py`` runs it on
recorded histories of runs judged collapsed or healthy by looking at them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gspo_bench import tables
from gspo_bench.callbacks.collapse import CollapseDetector, CollapseEvent
from gspo_bench.config import CollapseConfig

STABILISER_TAGS = ("routing_replay", "correction")
# what the detector reads (CollapseDetector.conditions / update_eval)
DETECTOR_METRICS = ("reward/mean", "policy/entropy", "response/length_mean", "ratio/max", "ratio/token_log_std",
                    "kl/old", "train/loss", "train/grad_norm", "train/nonfinite", "eval/pass1")


@dataclass
class History:
    """One run's recorded metrics: ``steps[step] = {metric: value}`` and the eval curve ``[(step, pass1)]``."""

    name: str  # e.g. "arith-default/grpo/s3"
    steps: dict[int, dict[str, float]]
    evals: list[tuple[int, float]]
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def eval_start(self) -> float | None:
        return self.evals[0][1] if self.evals else None

    @property
    def eval_end(self) -> float | None:
        return self.evals[-1][1] if self.evals else None


def replay(history: History, cfg: CollapseConfig | None = None) -> list[CollapseEvent]:
    """The events a live run with these metrics would have logged (evaluations after their step's update,
    the step-0 evaluation first, as in a run)."""
    det = CollapseDetector(cfg or CollapseConfig())
    evals = dict(history.evals)
    events = det.update_eval(0, evals[0]) if 0 in evals else []
    for step in sorted(history.steps):
        events += det.update(step, history.steps[step])
        if step in evals and step != 0:
            events += det.update_eval(step, evals[step])
    return events


def from_mlflow(uri: str, experiment: str) -> list[History]:
    """Histories of every FINISHED benchmark run of ``experiment``."""
    from gspo_bench.reporting.leaderboard import load_runs
    from gspo_bench.reporting.frame import FINISHED

    out = []
    for run in load_runs(uri, experiment, metrics=DETECTOR_METRICS):
        if run.status != FINISHED:
            continue
        steps: dict[int, dict[str, float]] = {}
        for key, curve in run.history.items():
            if key == "eval/pass1" or key.startswith("collapse/"):
                continue
            for step, value in curve:
                steps.setdefault(step, {})[key] = value
        keep = {k: run.tags[k] for k in ("algo", "seed", "model", "preset", *STABILISER_TAGS) if k in run.tags}
        keep.update({"lr": run.params.get("train.lr", "?"), "experiment": experiment})
        # a stabiliser that is on names the run too, so a grid's cells stay apart
        on = [f"{k}={run.tags[k]}" for k in STABILISER_TAGS if run.tags.get(k, "none") != "none"]
        name = "/".join([experiment, run.algo, f"s{run.seed}", *on])
        out.append(History(name, steps, run.history.get("eval/pass1", []), keep))
    return sorted(out, key=lambda h: h.name)


def save(histories: list[History], path: str | Path, labels: dict[str, str] | None = None) -> None:
    """JSON, columnar: per run its steps, each metric's values on those steps (null where not logged;
    5 significant digits), the eval curve, tags and an optional label ("collapsed" / "healthy")."""
    def r(x: float | None):
        return None if x is None else float(f"{x:.5g}")

    data = []
    for h in histories:
        steps = sorted(h.steps)
        keys = sorted({k for m in h.steps.values() for k in m})
        data.append({"name": h.name, "label": (labels or {}).get(h.name, ""), "tags": h.tags,
                     "evals": [[s, r(v)] for s, v in h.evals], "steps": steps,
                     "metrics": {k: [r(h.steps[s].get(k)) for s in steps] for k in keys}})
    Path(path).write_text(json.dumps(data, separators=(",", ":")) + "\n")


def load(path: str | Path) -> list[tuple[History, str]]:
    """(history, label) pairs from a ``save`` file."""
    out = []
    for d in json.loads(Path(path).read_text()):
        steps = {s: {k: v[i] for k, v in d["metrics"].items() if v[i] is not None} for i, s in enumerate(d["steps"])}
        out.append((History(d["name"], steps, [tuple(e) for e in d["evals"]], d.get("tags", {})), d.get("label", "")))
    return out


def markdown(rows: list[tuple[History, str, list[CollapseEvent]]]) -> str:
    """One line per run: label, eval pass@1 start -> end, events (kind@step), and the verdict against the label."""
    cells = []
    for h, label, events in rows:
        ev = ", ".join(f"{e.kind}@{e.step}" for e in events) or "-"
        if label == "collapsed":
            verdict = "caught" if events else "**missed**"
        elif label == "healthy":
            verdict = "**false positive**" if events else "quiet"
        else:
            verdict = "-"
        start = f"{h.eval_start:.3f}" if h.eval_start is not None else "-"
        end = f"{h.eval_end:.3f}" if h.eval_end is not None else "-"
        cells.append([h.name, h.tags.get("lr", "?"), label or "-", f"{start} -> {end}", ev, verdict])
    lines = tables.markdown(("run", "lr", "judged", "eval pass@1 start -> end", "events (kind@step)", "detector"),
                            cells).rstrip("\n").split("\n")
    return "\n".join(lines) + "\n"
