"""The one door to MLflow's client for the packages above ``tracking``: they read and write runs through these
functions and never import mlflow themselves (an import-linter contract holds it).

- ``client``: an ``MlflowClient`` for a tracking URI.
- ``all_runs``: every run of some experiments, page by page (MLflow's own pager over ``search_runs``).
- ``artifact_json``: a JSON artifact of a run, None where it is absent or unreadable.
- ``run_statuses``: the names of MLflow's run statuses.
- ``local_artifact_dir`` / ``artifact_repository``: where a run's artifacts live, a local folder when they are
  on this machine, else the repository MLflow reaches them through.
- ``start_run``, ``end_run`` and ``run_lifetime``: the one lifecycle of a run this package opens outside
  training (a report, a study's parent run) and of every run it ends (a training run's through its logger, a
  stale trial's, a run whose rank died): opened with its tags, ended once with its reason as tags, a report as
  a text artifact, then its status; ``run_lifetime`` ends it with the block it wraps.

mlflow is imported inside each function: importing ``gspo_bench`` stays cheap.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

PAGE = 1000  # runs per page, the page size MLflow's own search_runs() walks with
MOST = 1_000_000  # runs read at most


def client(uri: str):
    """An ``MlflowClient`` on ``uri``."""
    import mlflow

    return mlflow.MlflowClient(uri)


def all_runs(mlflow_client, experiment_ids: list[str], filter_string: str = "") -> list:
    """Every run of ``experiment_ids`` matching ``filter_string``, however many pages they take."""
    from mlflow.utils import get_results_from_paginated_fn

    return get_results_from_paginated_fn(
        lambda n, token: mlflow_client.search_runs(experiment_ids, filter_string, max_results=n, page_token=token),
        PAGE, MOST)


def artifact_json(mlflow_client, artifact_uri: str, path: str):
    """The JSON artifact ``path`` under ``artifact_uri``, None when it is absent or unreadable. The artifacts a
    tracking server proxies (``mlflow-artifacts:``) resolve through the client's tracking URI, used for this
    call only."""
    import mlflow
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    try:
        with _use_tracking_uri(mlflow_client.tracking_uri):
            return mlflow.artifacts.load_dict(f"{artifact_uri.rstrip('/')}/{path}")
    except Exception:  # absent or unreadable: the caller falls back or skips
        return None


def run_statuses() -> list[str]:
    """MLflow's run statuses by name, sorted (FAILED, FINISHED, KILLED, RUNNING, SCHEDULED)."""
    from mlflow.entities import RunStatus

    return sorted(RunStatus.to_string(s) for s in RunStatus.all_status())


def local_artifact_dir(artifact_uri: str) -> Path | None:
    """The folder of ``artifact_uri`` when it is on this machine (a path or ``file:`` URI), else None."""
    from mlflow.utils.uri import is_local_uri

    if not is_local_uri(artifact_uri, is_tracking_or_registry_uri=False):
        return None
    from mlflow.utils.file_utils import local_file_uri_to_path

    return Path(local_file_uri_to_path(artifact_uri))


def artifact_repository(mlflow_client, run_id: str):
    """The repository MLflow reaches run ``run_id``'s artifacts through (a server's proxy, object storage...)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    return get_artifact_repository(mlflow_client.get_run(run_id).info.artifact_uri,
                                   tracking_uri=mlflow_client.tracking_uri)


def start_run(mlflow_client, experiment_id: str, name: str, tags: dict[str, str] | None = None) -> str:
    """Open a run named ``name`` in ``experiment_id`` with ``tags``; its id."""
    return mlflow_client.create_run(experiment_id, run_name=name, tags=dict(tags or {})).info.run_id


def end_run(mlflow_client, run_id: str, status: str, *, tags: dict[str, str] | None = None,
            text: tuple[str, str] | None = None) -> None:
    """End ``run_id`` with ``status`` (FINISHED, FAILED or KILLED): first its ``tags`` (a reason), then ``text`` as
    the artifact (text, name) (another rank's report), then the status, so a reader who sees it ended finds why."""
    for key, value in (tags or {}).items():
        mlflow_client.set_tag(run_id, key, value)
    if text is not None:
        mlflow_client.log_text(run_id, *text)
    mlflow_client.set_terminated(run_id, status)


@contextlib.contextmanager
def run_lifetime(mlflow_client, run_id: str, on_error: str = "FAILED"):
    """End ``run_id`` with the block: FINISHED when it returns, ``on_error`` when it raises, KILLED when it is
    interrupted (KeyboardInterrupt, SystemExit); what was raised goes on."""
    status = on_error
    try:
        yield run_id
        status = "FINISHED"
    except (KeyboardInterrupt, SystemExit):
        status = "KILLED"
        raise
    finally:
        end_run(mlflow_client, run_id, status)
