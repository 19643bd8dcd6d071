"""What a user sees of gspo_bench's runs in MLflow's UI.

- ``mark_experiment``: the experiment tag ``mlflow.experimentKind =
  custom_model_development`` ("Machine learning"), set on every experiment
  gspo_bench creates or writes to (``runs.open_run``, ``tune``'s
  experiment, ``report``'s run), unless someone already chose a kind: MLflow's
  record that these are training runs (metrics, charts), not GenAI traces.
- ``run_description``: the run's ``mlflow.note.content`` tag, the Markdown
  "Description" on its run page: the algorithm (ratio unit, loss, clip band,
  aggregation, from ``losses.LOSSES``), task, model, seed, preset, the RL
  budget and the stabilisers it ran with, as a leaderboard row's context.
- ``ui_url``: a page of the UI that opens on the runs table. The 3.17 UI
  picks an experiment's sections from its "GenAI | Model training" switch
  (the URL's ``workflowType``, else the browser's last choice, GenAI by
  default), not from the tag, so a plain ``#/experiments/<id>`` opens on the
  GenAI "Overview" of traces; the link needs ``?workflowType=machine_learning``
  (``results/mlflow-ui.md``).

Credentials: a tracking server's user and password may be given in the URI
(``http://alice:pw@host:5000``): MLflow's client hands the URI to
``requests``, which sends its userinfo as HTTP Basic auth, for tracking and
for proxied artifacts alike. ``MLFLOW_TRACKING_USERNAME`` /
``MLFLOW_TRACKING_PASSWORD`` work as well and keep the password out of the
command line. Either way only the masked URI is written out (``redact``).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
NOTE_TAG = "mlflow.note.content"
WORKFLOW_QUERY = "workflowType=machine_learning"
DEFAULT_UI = "http://127.0.0.1:5000"  # where ``mlflow ui`` / ``mlflow server`` listen by default
CLAIM_KIND = "claim"  # the ``kind`` tag of a suite driver's claim on a cell (``cells.py``)
# runs that hold outputs (a report, a study) or a claim, not training: tag ``kind``
HIDDEN_KINDS = ("report", "study", CLAIM_KIND)


def benchmark_run(tags: Mapping[str, str]) -> bool:
    """Whether a run with these tags is a benchmark run, one that tables count and a suite cell can be: not a
    report, study or claim run (``HIDDEN_KINDS``) and not one of ``tune``'s trials."""
    return tags.get("kind") not in HIDDEN_KINDS and tags.get("tuning") != "trial"


def mark_experiment(client, experiment_id: str) -> None:
    """Tag the experiment ``mlflow.experimentKind = custom_model_development``; a kind already set (the UI's
    kind selector, another tool) is kept. A server that refuses the write (a user without EDIT permission)
    leaves the experiment as it is: the tag is cosmetic and must not stop a run."""
    from mlflow.exceptions import MlflowException

    try:
        if not client.get_experiment(experiment_id).tags.get(EXPERIMENT_KIND_TAG):
            client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    except MlflowException:
        pass


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _get(d: Mapping | None, *path, default=None):
    for key in path:
        if not isinstance(d, Mapping) or key not in d:
            return default
        d = d[key]
    return d


def stabilisers(settings: Mapping | None) -> list[str]:
    """The settings that depart from a plain on-policy float32 run, in words (empty: none)."""
    ro = _get(settings, "resolved", "rollout") or _get(settings, "rollout") or {}
    loss = _get(settings, "resolved", "loss") or _get(settings, "loss") or {}
    found = []
    if ro.get("correction") not in (None, "none"):
        level = ro.get("correction_level")
        at = "" if level in (None, "unit") else f", {level} level"
        floor = "" if ro.get("correction_min") is None else f", floor {_num(ro['correction_min'])}"
        found.append(f"{ro['correction'].upper()} correction (cap {_num(ro.get('correction_cap'))}{floor}{at})")
    if ro.get("opsm_threshold") is not None:
        found.append(f"off-policy sequence masking (threshold {_num(ro['opsm_threshold'])})")
    replay = _get(settings, "moe", "routing_replay")
    if replay not in (None, "none"):
        found.append(f"routing replay {replay} (MoE models)")
    if ro.get("dtype") not in (None, "float32"):
        found.append(f"{ro['dtype']} rollouts")
    if isinstance(ro.get("staleness"), int) and ro["staleness"] > 0:
        found.append(f"staleness {ro['staleness']}")
    if ro.get("old_logp_source") == "rollout":
        found.append("old log-probs from the sampler")
    if ro.get("dynamic_sampling") is True:
        found.append("dynamic sampling")
    if isinstance(ro.get("overlong_buffer"), int):
        found.append(f"overlong shaping (buffer {ro['overlong_buffer']} tokens)")
    if ro.get("advantage_estimator") not in (None, "group"):
        found.append(f"advantage estimator {ro['advantage_estimator']}")
    if ro.get("advantage_scale") == "none":
        found.append("advantages without std scaling")
    elif ro.get("advantage_scale") == "batch":
        found.append("advantages scaled by the batch std")
    if ro.get("advantage_baseline") == "leave_one_out":
        found.append("leave-one-out baseline")
    if isinstance(loss.get("kl_coef"), (int, float)) and loss["kl_coef"] > 0:
        found.append(f"KL penalty {_num(loss['kl_coef'])} ({loss.get('kl_estimator', 'k3')})")
    if loss.get("dual_clip_c") is not None:
        found.append(f"dual clip c={_num(loss['dual_clip_c'])}")
    return found


def run_description(algo: str, seed: int, preset: str, task: str, model: str,
                    settings: Mapping | None = None) -> str:
    """One Markdown paragraph for the run's ``mlflow.note.content``; ``settings``: the run's settings as
    logged (``runner.resolved_settings``), for the clip band, budget and stabilisers (optional)."""
    from gspo_bench.core.losses import LOSSES

    spec = LOSSES.get(algo)
    loss = _get(settings, "resolved", "loss") or {}
    if spec is None:
        what = f"**{algo}**"
    else:
        lo = loss.get("eps_low", spec.eps_low)
        hi = loss.get("eps_high", spec.eps_high)
        band = f"[1 - {_num(lo)}, 1 + {_num(hi)}]" if lo is not None else f"(0, 1 + {_num(hi)}]"
        what = (f"**{algo}**: {spec.ratio}-level ratio, loss `{spec.loss}`, clip band {band}, "
                f"`{spec.aggregation}` aggregation")
    text = f"{what}; task `{task}`, model `{model}`, seed {seed}, preset `{preset}`"
    tuning = _get(settings, "tuning")
    if tuning not in (None, "default"):
        text += f" ({tuning} settings)"
    train, ro = _get(settings, "train") or {}, _get(settings, "resolved", "rollout") or {}
    if train.get("steps") and ro.get("prompts_per_step"):
        text += (f". {train['steps']} RL steps of {ro['prompts_per_step']} prompts x {ro.get('group_size')} "
                 f"samples, lr {_num(train.get('lr'))}")
    ws = _get(settings, "resolved", "warmstart") or {}
    if isinstance(ws.get("pass1"), (int, float)):
        text += f", from a warm start at greedy pass@1 {ws['pass1']:.1%}"
    found = stabilisers(settings)
    if settings is not None:
        text += ". Stabilisers: " + (", ".join(found) if found else "none (on-policy, float32 rollouts, "
                                                                     "no correction)")
    return text + "."


def ui_url(tracking_uri: str | None, experiment_id: str, run_id: str | None = None) -> str:
    """The UI page of an experiment's runs (or of one run) that opens in "Model training" mode: on the
    server itself for an ``http(s)`` tracking URI (its credentials left out), else on ``mlflow ui``'s default
    address."""
    base = DEFAULT_UI
    if tracking_uri and tracking_uri.split("://", 1)[0].lower() in ("http", "https"):
        parts = urlsplit(tracking_uri)
        host = parts.hostname or ""
        if ":" in host:  # an IPv6 literal keeps its brackets
            host = f"[{host}]"
        netloc = host + (f":{parts.port}" if parts.port else "")
        base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    page = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{base}/{page}?{WORKFLOW_QUERY}"
