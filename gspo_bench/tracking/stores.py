"""The MLflow tracking store as a shared and fallible resource.

- ``store_lock``: one lock per store for the first process that creates its
  tables. MLflow migrates an empty database on first contact, and two
  processes doing so together collide (SQLite: ``duplicate column name:
  step``; PostgreSQL: a unique-constraint error in ``CREATE TABLE``). ``run``
  and ``tune`` take the same lock: a file lock named after a SQLite file's
  path, or a PostgreSQL advisory lock.
- ``open_store``: the client and the experiment (if it exists), the tables
  made under that lock.
- ``check_artifact_location``: the folder a run's artifacts and checkpoints
  go to must take files, checked before any run exists (for a new
  experiment MLflow's default is ``./mlruns`` in the working directory).
- ``retry_budget``: how long a call to a tracking server keeps retrying.
  MLflow's own defaults (7 retries, exponential backoff, 120 s timeouts)
  let a dead server hold a run for minutes per call; the budget
  (``tracking.retry_budget_s``) bounds waits and timeouts together.
- ``unreachable`` / ``TrackingUnreachable``: an error that says the server
  is gone ends the command at once, without another round of retries on the
  way out (``lifecycle.RunLogger`` then writes nothing more); the last
  checkpoint stays on the server for ``--resume``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

from gspo_bench.config import ConfigError
from gspo_bench.paths import probe_writable_dir
from gspo_bench.tracking.redact import redact

PG_LOCK_KEY = 0x67_7370_6F62  # the PostgreSQL advisory lock held while a process creates a store's tables


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (an SQLAlchemy URL: MLflow's tracking URI or Optuna's storage)."""
    return Path(url[len("sqlite:///"):]).expanduser() if url.startswith("sqlite:///") else None


@contextlib.contextmanager
def _file_lock(path: Path):
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock (start the first process alone there)
        yield
        return
    key = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"gspo_bench-{key}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def _advisory_lock(url: str):
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    engine = sqlalchemy.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": PG_LOCK_KEY})
            try:
                yield
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": PG_LOCK_KEY})
    finally:
        engine.dispose()


@contextlib.contextmanager
def store_lock(url: str):
    """Hold the store's lock: a file lock for a SQLite file (the lock file in the temp folder, named after
    the database's path), an advisory lock on PostgreSQL (``url`` with its driver,
    ``postgresql+psycopg://``); nothing for other stores, which create their tables themselves (a
    tracking server) or are not shared."""
    path = sqlite_path(url)
    if path is not None:
        with _file_lock(path):
            yield
    elif url.lower().startswith(("postgresql:", "postgresql+")):
        with _advisory_lock(url):
            yield
    else:
        yield


def _lock_url(uri: str) -> str:
    """The URL ``store_lock`` connects with: a driver-less PostgreSQL URL gets psycopg 3 (the postgres extra)."""
    scheme, _, rest = uri.partition("://")
    return f"postgresql+psycopg://{rest}" if scheme.lower() in ("postgresql", "postgres") else uri


def open_store(uri: str, experiment: str):
    """``(client, experiment or None)``: the first contact with the store (which creates its tables when
    the database is new) under ``store_lock``. MLflow keeps one store per URI in a process, so later clients
    find the tables made."""
    import mlflow

    with store_lock(_lock_url(uri)):
        client = mlflow.MlflowClient(uri)
        return client, client.get_experiment_by_name(experiment)


def ensure_experiment(uri: str, name: str, artifact_location: str | None = None) -> str:
    """The experiment's id, created under ``store_lock`` when it does not exist yet (processes started
    together would each create it, and all but one get a unique-constraint error)."""
    import mlflow

    with store_lock(_lock_url(uri)):
        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except Exception:  # made meanwhile by a process on another machine
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id


def _writable(path: Path) -> OSError | None:
    """None when files can be made in ``path`` (or, where it does not exist yet, in its nearest existing
    folder); the error otherwise (``paths.probe_writable_dir``: a real write probe)."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return NotADirectoryError(20, "not a directory", str(probe))
    try:
        probe_writable_dir(probe)
    except OSError as e:
        return e
    return None


def check_store(uri: str, experiment: str, override: str | None = None) -> None:
    """Before any run: the store answers (a ConfigError when a tracking server does not) and the experiment's
    artifact folder takes files (``check_artifact_location``). A SQLite file that does not exist yet is not
    created here (a bad flag found later must leave nothing behind): its experiment is new, and MLflow's
    default root for it is ``./mlruns``."""
    path = sqlite_path(uri)
    if path is not None and not path.exists():
        check_artifact_location(None, None, experiment, override, default_root=os.path.abspath("mlruns"))
        return
    try:
        client, exp = open_store(uri, experiment)
    except Exception as e:
        if not unreachable(e):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ConfigError(f"tracking server {redact(uri)} does not answer: {redact(first)}") from None
    check_artifact_location(client, exp, experiment, override)


def check_artifact_location(client, experiment, name: str, override: str | None = None,
                            default_root: str | None = None) -> None:
    """ConfigError unless the experiment's artifact folder takes files: its own location when it exists, else
    ``override`` (``tracking.artifact_location``) or the store's default root (``default_root``, else the
    client's store's: ``./mlruns`` for a database store). Locations that are not local folders (a tracking
    server's proxied artifacts, object stores) are the server's to check."""
    from mlflow.utils.file_utils import local_file_uri_to_path
    from mlflow.utils.uri import is_local_uri

    if experiment is not None:
        location, whose = experiment.artifact_location, f"experiment {name!r}"
    elif override:
        location, whose = override, "tracking.artifact_location"
    else:
        store = getattr(getattr(client, "_tracking_client", None), "store", None)
        location = default_root or getattr(store, "artifact_root_uri", None)
        whose = "the new experiment (MLflow's default: ./mlruns in the working directory)"
        if location is None:  # a tracking server: it keeps the artifacts
            return
    if not location or not is_local_uri(location, is_tracking_or_registry_uri=False):
        return
    path = Path(local_file_uri_to_path(location))
    error = _writable(path)
    if error is not None:
        raise ConfigError(f"artifact location {str(path)!r} of {whose} cannot take files "
                          f"({error.strerror or error}): run from a writable folder, or set "
                          "tracking.artifact_location (--set tracking.artifact_location=/writable/dir) for a new "
                          "experiment")


# -- a tracking server that stops answering ---------------------------------------------------------------------
def retry_settings(budget_s: float) -> dict[str, str]:
    """MLflow's HTTP retry settings that keep one call within ``budget_s`` seconds in all.

    urllib3 waits ``f * 2**(n - 1)`` before the ``n``-th retry (none before the first), so ``r`` retries
    with ``f = 1`` wait ``2**r - 2`` seconds. The retries take the most whose waits fit a quarter of the
    budget, and each of the ``r + 1`` attempts gets an equal share of the rest as its timeout (a server that
    accepts connections and never answers costs timeouts, one that is gone costs only the waits)."""
    def waits(r: int) -> int:
        return 2 ** r - 2 if r else 0

    retries = 0
    # one more retry while its waits fit a quarter and every attempt keeps a second (MLflow allows 10 at most)
    while waits(retries + 1) <= budget_s / 4 and retries + 2 <= budget_s - waits(retries + 1) and retries < 10:
        retries += 1
    timeout = max(1, int((budget_s - waits(retries)) / (retries + 1)))
    return {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries), "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
            "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout)}


def apply_retry_budget(budget_s: float | None) -> None:
    """Set MLflow's HTTP retry settings for this process from ``tracking.retry_budget_s`` (None: MLflow's own
    defaults, several minutes per call)."""
    if budget_s is not None:
        os.environ.update(retry_settings(budget_s))


def unreachable(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from) says a tracking server could not be reached: a
    refused or timed-out connection, or retries exhausted on 5xx answers."""
    import requests
    import urllib3

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                            requests.exceptions.RetryError, urllib3.exceptions.MaxRetryError)):
            return True
        text = str(exc)
        # MLflow re-raises these as MlflowException with the message only
        if "Max retries exceeded" in text or "Failed to establish a new connection" in text:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class TrackingUnreachable(Exception):
    """The tracking server stopped answering mid-run; the command ends (exit 1) without calling it again."""


def unreachable_message(uri: str, budget_s: float | None, what: str, checkpoint_step: int | None) -> str:
    spent = f"{budget_s:g} s of retries" if budget_s is not None else "MLflow's retries"
    kept = (f"its last checkpoint (RL step {checkpoint_step}) is on the server" if checkpoint_step else
            "it had no checkpoint yet")
    return (f"tracking server {redact(uri)} stopped answering ({spent}, tracking.retry_budget_s): {what} stopped; "
            f"{kept}: once the server is back, run the same command with --resume")
