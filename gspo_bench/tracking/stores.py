"""The MLflow tracking store as a shared and fallible resource.

- ``probe_store``: the one store check every command runs before it opens a tracking store or an Optuna
  storage. Its first contact is bounded by ``tracking.connect_timeout_s`` and any failure (refused, unknown
  host, authentication, a file that is not a database) is one ConfigError naming the store, its password
  masked. ``check_store`` (``run``, ``tune``, ``suite``) and ``check_readable`` (``leaderboard``,
  ``report``, ``claims``, ``collapse-check``) add MLflow's own first contact, where a schema it cannot
  migrate shows.
- ``store_lock``: one lock per store for the first process that creates its
  tables. MLflow migrates an empty database on first contact, and two
  processes doing so together collide (SQLite: ``duplicate column name:
  step``; PostgreSQL: a unique-constraint error in ``CREATE TABLE``). ``run``
  and ``tune`` take the same lock: a file lock named after a SQLite file's
  path, or a PostgreSQL advisory lock.
- ``open_store``: the client and the experiment (if it exists), the tables
  made under that lock.
- ``writable_uri``: the URI ``run`` writes to (and ``report``, which logs
  its own run), a SQLite file's folder (and the file, where it exists)
  checked for writes.
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
import threading
from pathlib import Path

from gspo_bench.config import CONNECT_TIMEOUT_S, ConfigError, resolve_tracking_uri
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


def writable_uri(setting: str | None) -> str:
    """The URI runs are written to (``config.resolve_tracking_uri`` of ``tracking.tracking_uri``); a sqlite
    file's folder must exist and, with the file if it exists, be writable (SQLite writes its journal beside
    the file: a writable file in a read-only folder takes no write)."""
    uri = resolve_tracking_uri(setting)
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):]).expanduser()
        if not db.parent.resolve().is_dir():
            raise ConfigError(f"tracking URI {uri!r}: directory {str(db.parent)!r} does not exist")

        def refused(path: Path, e: OSError) -> ConfigError:
            return ConfigError(f"tracking URI {uri!r}: cannot write {str(path)!r} ({e.strerror or e})")

        # a real write (permission bits lie to root, and /proc-like folders refuse new files): the file where it
        # exists, then its folder
        if db.exists():
            try:
                with open(db, "ab"):
                    pass
            except OSError as e:
                raise refused(db, e) from None
        try:
            probe_writable_dir(db.parent.resolve())
        except OSError as e:
            raise refused(db.parent, e) from None
    return uri


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


# -- the one store check ------------------------------------------------------------------------------------------
def _first_line(e: BaseException) -> str:
    """The error's first line, without SQLAlchemy's "(Background on this error at: ...)" and with at most 300
    characters: what one error line has room for."""
    text = str(e).strip().split("\n(Background on")[0]
    return (text.splitlines() or [type(e).__name__])[0].strip()[:300] or type(e).__name__


def _probe_sqlite(path: Path) -> None:
    """An existing file must open as an SQLite database (read only: the probe writes nothing)."""
    import sqlite3

    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5)
    try:
        conn.execute("PRAGMA schema_version").fetchone()  # "file is not a database" shows here, not at connect
    finally:
        conn.close()


def _probe_database(url: str, timeout_s: float) -> None:
    """A database server (PostgreSQL, MySQL, ...) must take a connection within ``timeout_s`` and answer."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    scheme = url.split("://", 1)[0].split("+", 1)[0].lower()
    # libpq, PyMySQL and pymssql bound their connect with these arguments; other drivers by the thread below
    args = {"postgresql": {"connect_timeout": max(2, int(timeout_s))}, "mysql": {"connect_timeout": int(timeout_s)},
            "mssql": {"timeout": int(timeout_s)}}.get(scheme, {})
    engine = sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=args)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
    finally:
        engine.dispose()


def _probe_server(url: str, timeout_s: float) -> None:
    """An MLflow tracking server must answer a one-experiment search within ``timeout_s`` with HTTP 200, with
    the credentials MLflow itself would send (the URL's, or $MLFLOW_TRACKING_USERNAME / _PASSWORD / _TOKEN)."""
    import requests

    headers, auth = {}, None
    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"
    elif os.environ.get("MLFLOW_TRACKING_USERNAME"):
        auth = (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ.get("MLFLOW_TRACKING_PASSWORD", ""))
    answer = requests.get(f"{url.rstrip('/')}/api/2.0/mlflow/experiments/search", params={"max_results": 1},
                          headers=headers, auth=auth, timeout=timeout_s)
    if answer.status_code in (401, 403):
        raise PermissionError(f"it refused the credentials (HTTP {answer.status_code})")
    if answer.status_code != 200:
        raise OSError(f"it answered HTTP {answer.status_code} where an MLflow tracking server answers 200")


def probe_store(url: str, timeout_s: float = CONNECT_TIMEOUT_S, role: str = "tracking store") -> None:
    """The one store check, before a command opens ``url`` (a tracking URI or an Optuna storage URL): a
    ConfigError, one line naming the store with its password masked, unless it answers within ``timeout_s``.

    - ``sqlite:///``: an existing file must be an SQLite database; a missing one is the caller's to allow
      (``run`` creates it, the readers refuse it).
    - a database server: connect and ``SELECT 1``, through the URL's driver (psycopg 3 for ``postgresql://``).
    - an MLflow server (``http(s)://``): a search that must answer 200 (401 / 403: the credentials).
    The probe runs in a thread given ``timeout_s`` + 1 s: a driver that ignores its connect timeout (or a
    host that drops packets) still ends in one line in bounded time."""
    path = sqlite_path(url)
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower()
    if path is not None:
        if not path.exists():
            return
        probe = lambda: _probe_sqlite(path)  # noqa: E731
    elif scheme in ("http", "https"):
        probe = lambda: _probe_server(url, timeout_s)  # noqa: E731
    elif scheme in ("postgresql", "postgres", "mysql", "mssql"):
        probe = lambda: _probe_database(_lock_url(url), timeout_s)  # noqa: E731
    else:  # file stores, databricks: MLflow's own first contact checks them
        return
    failure: list[BaseException] = []

    def attempt():
        try:
            probe()
        except BaseException as e:  # noqa: BLE001 (any failure becomes the one line below)
            failure.append(e)

    worker = threading.Thread(target=attempt, daemon=True, name="gspo_bench-store-probe")
    worker.start()
    worker.join(timeout_s + 1.0)
    if worker.is_alive():
        raise ConfigError(f"{role} {redact(url)} does not answer within {timeout_s:g} s "
                          "(tracking.connect_timeout_s)")
    if failure:
        e = failure[0]
        verb = "does not answer" if _refused(e) else "cannot be opened"
        hint = (" (install the postgres extra: pip install '.[postgres]', i.e. psycopg 3)"
                if isinstance(e, ImportError) and scheme in ("postgresql", "postgres") else "")
        raise ConfigError(f"{role} {redact(url)} {verb}: {redact(_first_line(e))}{hint}")


def _refused(e: BaseException) -> bool:
    """Whether ``e`` says nothing answered (a refused or timed-out connection, an unknown host), as opposed to
    a store that answered and was wrong (not a database, bad credentials, a schema)."""
    import requests

    text = str(e).lower()
    return unreachable(e) or isinstance(e, requests.exceptions.RequestException) or any(
        w in text for w in ("connection refused", "timed out", "timeout expired", "could not translate host",
                            "name or service not known", "failed to resolve", "no route to host"))


def check_store(uri: str, experiment: str, override: str | None = None,
                timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Before any run: the store answers and opens (``probe_store``, then MLflow's own first contact, which
    migrates a new database and refuses a schema it cannot migrate; each failure a ConfigError) and the
    experiment's artifact folder takes files (``check_artifact_location``). A SQLite file that does not exist
    yet is not created here (a bad flag found later must leave nothing behind): its experiment is new, and
    MLflow's default root for it is ``./mlruns``."""
    probe_store(uri, timeout_s)
    path = sqlite_path(uri)
    if path is not None and not path.exists():
        check_artifact_location(None, None, experiment, override, default_root=os.path.abspath("mlruns"))
        return
    with _first_contact(uri):
        client, exp = open_store(uri, experiment)
    check_artifact_location(client, exp, experiment, override)


def check_readable(uri: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Before a command reads runs from ``uri``: ``probe_store``, then MLflow's first contact (listing one
    experiment), any failure a ConfigError. A missing SQLite file is refused before this (reading it would
    create an empty store)."""
    import mlflow

    probe_store(uri, timeout_s)
    with _first_contact(uri), store_lock(_lock_url(uri)):
        mlflow.MlflowClient(uri).search_experiments(max_results=1)


@contextlib.contextmanager
def _first_contact(uri: str):
    """MLflow's first contact with a store that passed ``probe_store``: any failure (a server gone meanwhile, a
    schema it cannot migrate) is one ConfigError naming the store, masked."""
    try:
        yield
    except Exception as e:
        verb = "does not answer" if unreachable(e) else "cannot be opened"
        raise ConfigError(f"tracking store {redact(uri)} {verb}: {redact(_first_line(e))}") from None


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
