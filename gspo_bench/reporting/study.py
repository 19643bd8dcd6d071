"""The report's tuning section (``report --storage URL [--study NAME]``): per study a summary, a trial-history
figure and a parameter-importance figure.

Both figures come from ``optuna.visualization.matplotlib`` (``plot_optimization_history``,
``plot_param_importances`` with Optuna's default evaluator, PED-ANOVA); they
draw with pyplot, so each figure is saved and closed at once. Importance needs
at least two COMPLETE trials with different values and a parameter that
varies; short of that the figure is skipped with a sentence saying why, as
the other report figures are.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from gspo_bench.config import ConfigError
from gspo_bench.reporting.leaderboard import slug
from gspo_bench.tracking.redact import redact
from gspo_bench.tuning.study import RUN_ATTR, best_of, counts, fmt_params, open_storage

MIN_COMPLETE_FOR_IMPORTANCE = 2


def _save(ax, path: Path, title: str) -> Path:
    import matplotlib.pyplot as plt

    for loc in ("left", "center", "right"):  # Optuna titles one plot centred, the other on the left
        ax.set_title("", loc=loc)
    ax.set_title(title)
    fig = ax.figure
    fig.set_size_inches(7.5, 4.2)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # "tight": keep the legend Optuna puts outside the axes
    plt.close(fig)
    return path


def _importance_gap(study) -> str | None:
    """Why importance cannot be computed for this study, or None when it can."""
    done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if len(done) < MIN_COMPLETE_FOR_IMPORTANCE:
        return f"{len(done)} complete trial(s); importance needs at least {MIN_COMPLETE_FOR_IMPORTANCE}"
    if len({t.value for t in done}) < 2:
        return "every complete trial has the same objective value, so no parameter explains any of it"
    if not any(len({t.params.get(p) for t in done}) > 1 for p in done[0].params):
        return "no searched parameter varies between the complete trials"
    return None


def study_section(study, out: Path, tag: str) -> tuple[list[str], list[Path]]:
    """Markdown and figures of one study; ``tag`` names its figure files (``tune_history_<tag>.png``)."""
    from optuna.visualization.matplotlib import plot_optimization_history, plot_param_importances

    a, c, best = study.user_attrs, counts(study), best_of(study)
    objective = a.get("objective", "the objective returned by each trial")
    md = [f"### Study `{study.study_name}`", "",
          f"`{a.get('algo', '?')}` on {a.get('task', '?')} / {a.get('model', '?')}, preset `{a.get('preset', '?')}`; "
          f"searched: {', '.join(a.get('params', [])) or '?'}; objective (maximised): {objective}. "
          f"Trials: {c['COMPLETE']} complete, {c['PRUNED']} pruned, {c['FAIL']} failed, {c['RUNNING']} running, "
          f"{c['WAITING']} waiting. MLflow parent run: `{a.get('mlflow_parent_run_id', '-')}`.", ""]
    figs: list[Path] = []
    if best is None:
        return md + ["No complete trial: no best parameters, no figures.", ""], figs
    md += [f"Best: trial {best.number}, objective {best.value:.4f}, {fmt_params(best.params)} "
           f"(MLflow run `{best.user_attrs.get(RUN_ATTR, '-')}`).", ""]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        figs.append(_save(plot_optimization_history(study, target_name="objective"), out / f"tune_history_{tag}.png",
                          f"{study.study_name}: trial history"))
        md += [f"![trial history, {study.study_name}]({figs[-1].name})", "",
               "Each dot is a complete trial's objective, the line the best so far (pruned and failed trials have "
               "no objective and are not drawn).", ""]
        gap = _importance_gap(study)
        if gap is None:
            try:
                figs.append(_save(plot_param_importances(study, target_name="objective"),
                                  out / f"tune_importance_{tag}.png", f"{study.study_name}: parameter importance"))
                md += [f"![parameter importance, {study.study_name}]({figs[-1].name})", "",
                       "Optuna's default importance evaluator (PED-ANOVA) over the complete trials.", ""]
            except (ValueError, RuntimeError, ZeroDivisionError) as e:
                gap = f"Optuna could not compute it ({type(e).__name__}: {e})"
        if gap is not None:
            md += [f"Parameter importance skipped: {gap}.", ""]
    return md, figs


def open_studies(storage_url: str, names: list[str] | None) -> tuple[object, list[str]]:
    """The storage and the studies to report (``names``, default every study in it), checked before anything
    is written: a storage that is unreachable or, for SQLite, not there, or a name it does not hold, is a
    ConfigError."""
    import optuna

    storage = open_storage(storage_url, must_exist=True)
    known = optuna.get_all_study_names(storage)
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        raise ConfigError(f"study {unknown[0]!r} is not in {redact(storage_url)} "
                          f"(studies: {', '.join(known) or 'none'})")
    return storage, list(names or known)


def tuning_section(storage_url: str, storage, names: list[str], out: Path) -> tuple[list[str], list[Path]]:
    """Markdown and figures for the studies ``names`` of ``storage`` (both from ``open_studies``)."""
    import optuna

    md = ["## Tuning studies", "", f"Optuna storage `{redact(storage_url)}`.", ""]
    figs: list[Path] = []
    for name in names:
        section, f = study_section(optuna.load_study(study_name=name, storage=storage), out, slug(name))
        md += section
        figs += f
    if not names:
        md += ["No study in this storage.", ""]
    return md, figs
