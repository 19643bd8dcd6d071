"""The documentation agrees with the code: the metrics table of docs/algorithms.md, relative links, the package
layout of docs/layout.md, and the MkDocs site builds strictly.

- Metrics: two short real runs (``ppo`` and ``dapo`` on ``tiny-moe``, 2 steps, a collapse forced by an
  impossible entropy floor) between them log every conditional metric: PPO's critic, DAPO's dynamic sampling,
  the MoE flip rate, the engine/trainer mismatch (the default fast engine returns log-probs), the entropy
  controls, rejection by KL and collapse events. Every name in the table must have been logged by one of them,
  and every logged name must be in the table. ``collapse/<kind>`` is a placeholder row: its kinds are checked
  against ``COLLAPSE_KINDS``. The
  ``tune/*`` rows are logged by ``tune`` only, which is too slow for this check; they are checked statically
  (a ``log_metric`` call with that literal name in ``gspo_bench/tuning/``).
- Links: every relative Markdown link ``[text](target)`` in README.md and docs/*.md resolves to an existing
  file or folder inside the repository (http(s)/mailto links and bare ``#anchors`` are skipped; a
  ``#fragment`` after a path is dropped).
- Layout: the code block under "## Modules" in docs/layout.md names every Python module of the package, in this
  format: one module per line, the line's first word being the module's path relative to ``gspo_bench/`` (e.g.
  ``rollout/engine.py``, ``__init__.py``), followed by a short description. Every such first word must be an
  existing module, so the block can neither miss a module nor keep a stale one.
- Site: ``mkdocs build --strict`` over mkdocs.yml exits 0, so every page is in the nav and every link and anchor
  between pages resolves (links out of docs/ are checked above and shown as repository paths by mkdocs_hooks.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from gspo_bench.callbacks import COLLAPSE_KINDS
from gspo_bench.config import load_config
from gspo_bench.train.runner import run
from tests.conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ALGORITHMS_DOC = ROOT / "docs" / "algorithms.md"
LAYOUT_DOC = ROOT / "docs" / "layout.md"
PACKAGE = ROOT / "gspo_bench"

# logged only by ``tune`` (a trial's run, the study's parent run): checked in the source, not by a run
TUNE_ONLY = ("tune/",)
# logged by asynchronous runs only (tests/test_overlap.py reads them back from one)
ASYNC_ONLY = ("async/", "time/weight_sync_s", "time/wait_rollout_s", "throughput/train_tokens_per_s")
# logged by multi-turn environments only (tests/test_episodes.py reads them back from runs on calc)
ENV_ONLY = ("env/",)


# -- the metrics table ----------------------------------------------------------------------------------------
def documented_metrics() -> list[tuple[str, str]]:
    """(name, definition) of each row of the "## Metrics" table of docs/algorithms.md."""
    text = ALGORITHMS_DOC.read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]
        m = re.fullmatch(r"`([^`]+)`", cells[0])
        if m:  # header and separator rows have no backticked first cell
            rows.append((m.group(1), cells[-1]))
    return rows


def _is_placeholder(name: str) -> bool:
    return "<" in name


@pytest.fixture(scope="module")
def logged(mixed_task, tracking_uri) -> list[set[str]]:
    """The metric names each of the two runs logged, read back from MLflow."""
    exp = "docs-metrics"
    cfg = load_config("smoke", overrides={
        **tiny_overrides(mixed_task, tracking_uri, rollout={"correction": "tis", "opsm_threshold": 0.5,
                                                            "m2_threshold": 1e3, "rejection": "seq_max_k3",
                                                            "rejection_threshold": 1e3},
                         loss={"entropy_coef": 0.01, "entropy_target": 1e3, "top_entropy_quantile": 0.9}),
        "algos": ["ppo", "dapo"],
        # a correction, OPSM, M2PO and rejection: their mismatch/* metrics are logged too; the entropy controls: loss/*
        "model": {"name": "tiny-moe"},
        # an entropy floor no policy can reach: an entropy_collapse event at step 1, so collapse/* are logged
        "collapse": {"entropy_floor": 100.0, "on_collapse": "continue"},
        "tracking": {"tracking_uri": tracking_uri, "experiment": exp}})
    results = run(cfg, log=lambda *a: None)
    assert [r.status for r in results] == ["FINISHED", "FINISHED"], [r.error for r in results]
    client = mlflow.MlflowClient(tracking_uri)
    return [set(client.get_run(r.run_id).data.metrics) for r in results]


def test_metrics_table_is_well_formed():
    rows = documented_metrics()
    names = [n for n, _ in rows]
    assert len(rows) > 30, "the Metrics table of docs/algorithms.md was not found or is nearly empty"
    assert len(names) == len(set(names)), f"duplicate rows: {sorted({n for n in names if names.count(n) > 1})}"
    assert all("/" in n for n in names), names
    assert all(d for _, d in rows), "every metric needs a definition"


def test_collapse_placeholder_names_every_kind():
    rows = dict(documented_metrics())
    assert "collapse/<kind>" in rows
    kinds = set(re.findall(r"`([a-z_]+)`", rows["collapse/<kind>"]))
    assert kinds == set(COLLAPSE_KINDS)
    assert [n for n in rows if _is_placeholder(n)] == ["eval/pass_at_<k>", "eval/mean_at_<k>", "env/turn<k>_length_mean",
                                                       "collapse/<kind>"]


def test_every_documented_metric_is_logged(logged):
    seen = set().union(*logged)
    missing = [name for name, _ in documented_metrics()
               if not _is_placeholder(name) and not name.startswith(TUNE_ONLY + ASYNC_ONLY + ENV_ONLY)
               and name not in seen]
    assert not missing, f"documented in docs/algorithms.md but logged by no run: {missing}"
    # the forced collapse shows up under its kind's name, pass@k under its k (the smoke preset's 2 samples: 1)
    assert "collapse/entropy_collapse" in seen and "eval/pass_at_1" in seen and "eval/mean_at_1" in seen


def test_every_logged_metric_is_documented(logged):
    documented = {n for n, _ in documented_metrics()}
    seen = set().union(*logged)
    collapse = {k for k in seen if k.startswith("collapse/")}
    assert collapse - {"collapse/events"} <= {f"collapse/{k}" for k in COLLAPSE_KINDS}, collapse
    pass_at = {k for k in seen if re.fullmatch(r"eval/(pass|mean)_at_\d+", k)}  # the eval/<pass|mean>_at_<k> rows
    undocumented = sorted(k for k in seen - collapse - pass_at if "/" in k and k not in documented)
    assert not undocumented, f"logged but missing from the Metrics table of docs/algorithms.md: {undocumented}"


def test_conditional_metrics_appear_only_where_documented(logged):
    ppo, dapo = logged
    assert {"critic/value_loss", "critic/explained_var", "critic/ref_kl"} <= ppo
    assert not any(k.startswith("critic/") for k in dapo)
    assert {"dynamic/dropped_groups", "dynamic/gen_batches", "dynamic/kept_groups"} <= dapo
    assert not any(k.startswith("dynamic/") for k in ppo)
    for keys in logged:
        assert {"moe/expert_flip_rate", "mismatch/kl", "mismatch/abs_diff_max",
                "mismatch/seq_log_ratio_std"} <= keys


def test_tune_metrics_are_logged_by_tune():
    source = "\n".join(p.read_text() for p in sorted((PACKAGE / "tuning").rglob("*.py")))
    names = [n for n, _ in documented_metrics() if n.startswith(TUNE_ONLY)]
    assert names, "the tune/* rows are gone from the table"
    for name in names:
        assert re.search(r"log_metric\([^)]*[\"']" + re.escape(name) + r"[\"']", source), name
    logged_by_tune = set(re.findall(r"log_metric\([^)]*?[\"'](tune/[a-z_]+)[\"']", source))
    assert logged_by_tune == set(names), logged_by_tune


# -- links ------------------------------------------------------------------------------------------------------
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def bad_links(md: Path, text: str | None = None) -> list[str]:
    """Relative links of ``md`` that do not resolve to an existing path inside the repository."""
    text = md.read_text() if text is None else text
    bad = []
    for target in LINK.findall(_without_code_blocks(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # http(s), mailto, ... and anchors within the page
        path = target.split("#", 1)[0]
        resolved = (md.parent / path).resolve()
        if not resolved.is_relative_to(ROOT):
            bad.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            bad.append(f"{target} (no such file)")
    return bad


def _markdown_files() -> list[Path]:
    return [README] + sorted((ROOT / "docs").glob("*.md"))


def test_link_checker_rejects_links_outside_the_repository():
    # a folder beside the checkout may exist on a developer's machine; a clone does not have it
    outside = bad_links(README, "[contract](../beside/CONTRACT.md)")
    assert outside == ["../beside/CONTRACT.md (outside the repository)"]
    assert bad_links(README, "[x](docs/nope.md)") == ["docs/nope.md (no such file)"]
    assert bad_links(README, "[a](docs/algorithms.md#metrics) [b](https://arxiv.org) [c](#layout)") == []


@pytest.mark.parametrize("md", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(md):
    assert bad_links(md) == []


def test_readme_links_the_algorithms_doc():
    assert "docs/algorithms.md" in LINK.findall(README.read_text())
    assert ALGORITHMS_DOC.is_file()


# -- the package layout block of docs/layout.md ----------------------------------------------------------------
def layout_modules() -> list[str]:
    """First words ending in ``.py`` of the lines of the code block under "## Modules" in docs/layout.md."""
    section = LAYOUT_DOC.read_text().split("\n## Modules\n", 1)[1]
    block = section.split("```", 2)[1]
    words = [line.split()[0] for line in block.splitlines() if line.split()]
    return [w for w in words if w.endswith(".py")]


def test_layout_doc_names_every_module():
    named = layout_modules()
    modules = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                     if "__pycache__" not in p.parts)
    assert len(named) == len(set(named)), f"named twice: {sorted({n for n in named if named.count(n) > 1})}"
    assert sorted(set(modules) - set(named)) == [], "modules missing from the Modules block of docs/layout.md"
    assert sorted(set(named) - set(modules)) == [], "the Modules block of docs/layout.md names modules that do not exist"


def test_readme_links_the_layout_doc():
    assert "docs/layout.md" in {t.split("#", 1)[0] for t in LINK.findall(README.read_text())}


# -- the documentation site ------------------------------------------------------------------------------------
def test_mkdocs_site_builds_strictly(tmp_path):
    # skipped only where the docs extra is not installed; the test extra includes it, so CI builds the site
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about its successor, not a warning
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").is_file()


# -- tests named in the docs ---------------------------------------------------------------------------------------
def test_every_test_the_docs_name_exists():
    """docs/reliability.md (and any page) names the tests that hold each guarantee: each must exist."""
    named = set()
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        named |= set(re.findall(r"(tests/[\w/]+\.py)::(\w+)", page.read_text()))
    assert len(named) >= 25
    for path, name in sorted(named):
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} is named in the docs but does not exist"


# -- references a user can follow ------------------------------------------------------------------------------
# what the project never cites: a contract file outside the repository, the folder beside the checkout, a private
# tracker's issue numbers (built from pieces, so this file does not match itself)
DANGLING = re.compile("|".join([r"ALGORITHMS" + r"\.md", r"\.\./" + "shared", r"\b[Ii]ssues? #?\d+\b", r"\bissue-\d+\b",
                                r"\bthe " + r"issue('s)?\b"]))


def _text_files() -> list[Path]:
    skip = {".git", ".venv", "__pycache__", ".pytest_cache"}
    roots = [ROOT / "gspo_bench", ROOT / "tests", ROOT / "docs", ROOT / "results", ROOT / "baselines", ROOT / "tasks"]
    files = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / ".ci" / "run"]
    for r in roots:
        files += [p for p in r.rglob("*") if p.is_file() and not skip & set(p.parts)
                  and p.suffix in (".py", ".md", ".yaml", ".yml", ".txt", ".json", ".csv", ".toml")]
    return files


def test_no_reference_a_user_cannot_follow():
    found = [f"{p.relative_to(ROOT)}:{n}: {m.group(0)!r}" for p in _text_files()
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) for m in DANGLING.finditer(line)]
    assert not found, "cite docs/ or the paper instead:\n" + "\n".join(found[:40])


def test_the_reference_check_catches_each_kind():
    for text in ("see ALGORITHMS" + ".md", "../" + "shared/seeds", "as iss" + "ue 13 says", "iss" + "ue-5 reference",
                 "the " + "issue's bar"):
        assert DANGLING.search(text), text
    assert not DANGLING.search("docs/algorithms.md, arXiv 2510.11370, tissue 3")


# -- counts in prose ---------------------------------------------------------------------------------------------
WORDS = {w: n for n, w in enumerate("eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen "
                                    "twenty".split(), 11)}
# "all N algorithms", or a spelled-out count of eleven or more; " of that time" marks a count that was true then
COUNT = re.compile(r"\b(?:(?:all|the) (\d+)|(" + "|".join(WORDS) + r")) algorithms\b(?! of that time)( against)?",
                   re.IGNORECASE)


def _prose_counts(text: str) -> list[tuple[int, int]]:
    """(the count a phrase states, the count it should state: the registry's, one fewer against a baseline)."""
    from gspo_bench import algorithms

    n = len(algorithms.names())
    # a phrase may wrap: read each paragraph as one line
    flat = re.sub(r"\s*\n\s*", " ", text)
    return [(int(m.group(1)) if m.group(1) else WORDS[m.group(2).lower()], n - 1 if m.group(3) else n)
            for m in COUNT.finditer(flat)]


def test_the_algorithm_counts_in_prose_match_the_registry():
    wrong = [(p.name, said, want) for p in [README, *sorted((ROOT / "docs").glob("*.md"))]
             for said, want in _prose_counts(p.read_text()) if said != want]
    assert not wrong, wrong


def test_the_prose_count_check_reads_each_form():
    from gspo_bench import algorithms

    n = len(algorithms.names())
    assert _prose_counts(f"runs all {n}\n  algorithms here") == [(n, n)]
    assert _prose_counts("with Fourteen algorithms against one baseline") == [(14, n - 1)]
    assert _prose_counts("all 13 algorithms of that time; the six algorithms it began with") == []


def _layout_example(heading: str) -> str:
    """The python block under ``heading`` in docs/layout.md."""
    text = (ROOT / "docs" / "layout.md").read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_environments_doc_s_one_file_environment_plays_as_written(tmp_path):
    from gspo_bench.tasks import GENERATORS, load_task, make_environment, scripted
    from gspo_bench.tasks import environments
    from gspo_bench.tasks.environments.tools import CompactTools
    from gspo_bench.tasks.prompts import TOOL_SCHEMAS

    text = (ROOT / "docs" / "environments.md").read_text()
    section = text.split("## Bringing your own environment\n", 1)[1]
    code, spec = (re.search(rf"```{kind}\n(.*?)```", section, re.S).group(1) for kind in ("python", "yaml"))
    exec(code, {})
    try:
        (tmp_path / "double.yaml").write_text(spec)
        task = load_task(str(tmp_path / "double.yaml"), 0)
        assert TOOL_SCHEMAS["double"][0]["function"]["name"] == "add"
        env = make_environment("double", task, tools=CompactTools(), max_turns=3)
        segments, reward = scripted(env, task.eval[0])
        assert reward == 1.0 and "".join(t for _, t in segments) == task.eval[0]["target"] == "[10+10]=20\n20"
        env.reset(task.eval[0])
        bad = env.step("[ten+ten]")
        assert (bad.observation, bad.done, bad.info["tool_error"]) == ("=error\n", False, True)
        assert env.step("21").reward == 0.0
    finally:
        environments.ENVIRONMENTS.pop("double", None)
        GENERATORS.pop("double", None)
        TOOL_SCHEMAS.pop("double", None)


def test_the_layout_doc_s_one_file_estimator_and_environment_run_as_written():
    import torch

    from gspo_bench.core import advantages, names
    from gspo_bench.tasks import environments

    space: dict = {}
    exec(_layout_example("Adding an advantage estimator"), space)
    exec(_layout_example("Adding an environment"), space)
    try:
        fn = advantages.ADVANTAGE_ESTIMATORS["max_baseline"]
        assert "max_baseline" in names.ADVANTAGE_ESTIMATOR_NAMES
        got = fn(torch.tensor([1.0, 0.0, 0.0, 0.0]), 2, scale="group", baseline="group_mean", all_sum=None)
        assert got.tolist() == [0.0, -1.0, 0.0, 0.0]
        task = type("T", (), {"verify": staticmethod(lambda text, answer: float(text == answer))})()
        env = environments.make_environment("echo_twice", task)
        assert env.reset({"prompt": "2+2=", "answer": "4"}) == "2+2="
        first = env.step("5")
        assert (first.observation, first.reward, first.done) == (" you said 5; again:", 0.0, False)
        second = env.step("4")
        assert (second.observation, second.reward, second.done) == (None, 1.0, True)
    finally:
        advantages.ADVANTAGE_ESTIMATORS.pop("max_baseline", None)
        if "max_baseline" in names.ADVANTAGE_ESTIMATOR_NAMES:
            names.ADVANTAGE_ESTIMATOR_NAMES.remove("max_baseline")
        environments.ENVIRONMENTS.pop("echo_twice", None)
