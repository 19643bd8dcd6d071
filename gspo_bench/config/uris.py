"""Where runs are tracked: the MLflow store a tracking URI names, checked before any work."""

from __future__ import annotations

from gspo_bench.config.sections import ConfigError

TRACKING_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")
"""URI schemes of the MLflow tracking stores (a database, or a tracking server)."""
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
"""The MLflow store when neither ``tracking.tracking_uri`` (``--tracking-uri``) nor $MLFLOW_TRACKING_URI names one."""


def resolve_tracking_uri(uri: str | None) -> str:
    """``uri``, else $MLFLOW_TRACKING_URI, else ``DEFAULT_TRACKING_URI``; a bare path is a ConfigError.

    Shared by ``stores.writable_uri`` (writing: the sqlite file's folder must
    exist) and ``leaderboard.read_uri`` (reading: the sqlite file must exist).
    """
    import os

    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if "://" not in uri:
        raise ConfigError(f"tracking URI {uri!r} is a bare path; mlflow 3 needs a database URI such as "
                          f"{DEFAULT_TRACKING_URI}")
    # the scheme before any "+driver" (postgresql+psycopg://) must be a store MLflow can open
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower()
    if scheme not in TRACKING_SCHEMES:
        raise ConfigError(f"tracking URI {uri!r}: scheme {scheme!r} is not an MLflow tracking store (use one of "
                          f"{', '.join(s + '://' for s in TRACKING_SCHEMES)})")
    return uri
