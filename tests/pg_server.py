"""A throwaway PostgreSQL server for tests: the ``pg_url`` fixture (module scope).

It runs the server binaries of Debian's ``postgresql`` package (``/usr/lib/postgresql/<version>/bin``, the
newest version; ``GSPO_BENCH_PG_BIN=/some/bin`` picks another folder) on a fresh data directory in a
temporary folder, listening on a free port of 127.0.0.1 and on a unix socket inside that folder. It makes a
user with a random password and a database of the same name, yields
``postgresql+psycopg://USER:PASSWORD@127.0.0.1:PORT/DB``, then stops the server (``pg_ctl stop -m
immediate``) and removes the folder.

PostgreSQL refuses to run as root: as root the server runs as the ``postgres`` system user (made by the
Debian package) through ``runuser -u postgres --``, the temporary folder handed to that user; otherwise as
the current user. The server is tuned for throwaway data (no fsync, no synchronous commit).

Skips, naming what is missing: psycopg 3 (``pip install -e ".[postgres]"``), the server binaries
(``apt-get install postgresql``), or, as root, the ``postgres`` user or ``runuser``.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

BIN_ENV = "GSPO_BENCH_PG_BIN"
USER = DB = "gspo_bench"
SERVER_USER = "postgres"  # the Debian package's system user, for when we are root
BINARIES = ("initdb", "pg_ctl")


def _version(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", Path(path).parent.name)) or (0,)


def server_binaries() -> tuple[Path | None, str]:
    """The folder holding initdb and pg_ctl, or None and a reason that names what is missing."""
    override = os.environ.get(BIN_ENV)
    if override:
        folder = Path(override)
        missing = [b for b in BINARIES if not (folder / b).is_file()]
        if missing:
            return None, (f"PostgreSQL server binaries not found: no {', '.join(missing)} in {BIN_ENV}={override} "
                          f"(unset it to use Debian's /usr/lib/postgresql/*/bin)")
        return folder, ""
    for found in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True):
        if all((Path(found) / b).is_file() for b in BINARIES):
            return Path(found), ""
    return None, ("PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin "
                  "(Debian package postgresql: apt-get install postgresql)")


def _skip_reason() -> str:
    """Why this machine cannot run the server ('' when it can)."""
    if importlib.util.find_spec("psycopg") is None:
        return 'psycopg 3 not installed (pip install "psycopg[binary]>=3.1", or pip install -e ".[postgres]")'
    folder, why = server_binaries()
    if folder is None:
        return why
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return (f"running as root, and PostgreSQL refuses root, but there is no {SERVER_USER!r} system user to run "
                    f"the server as (Debian package postgresql makes it: apt-get install postgresql)")
        if shutil.which("runuser") is None:
            return "running as root, and PostgreSQL refuses root, but runuser (util-linux) is not installed"
    return ""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server: ``start()``, ``url``, ``stop()``; as root every server command runs as ``postgres``."""

    def __init__(self, bindir: Path):
        self.bin = bindir
        self.as_root = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="gspo-bench-pg-"))  # not under pytest's 0700 root-owned folders
        self.data, self.sockets, self.logfile = self.root / "data", self.root / "sockets", self.root / "server.log"
        self.password = "pw-" + secrets.token_hex(12)
        self.port = 0
        self.started = False

    def _cmd(self, name: str, *args: str) -> list[str]:
        cmd = [str(self.bin / name), *args]
        return ["runuser", "-u", SERVER_USER, "--", *cmd] if self.as_root else cmd

    def _run(self, name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        for var in ("PGDATA", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGPASSWORD"):
            env.pop(var, None)
        return subprocess.run(self._cmd(name, *args), cwd=self.root, env=env, capture_output=True, text=True,
                              timeout=timeout)

    def _check(self, proc: subprocess.CompletedProcess, what: str) -> None:
        if proc.returncode != 0:
            log = self.logfile.read_text(errors="replace")[-2000:] if self.logfile.exists() else ""
            raise RuntimeError(f"{what} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n{log}")

    def start(self) -> None:
        self.sockets.mkdir()
        if self.as_root:
            import pwd

            pw = pwd.getpwnam(SERVER_USER)
            for path in (self.root, self.sockets):
                os.chown(path, pw.pw_uid, pw.pw_gid)
        # the superuser (named after whoever runs the server) logs in over the socket without a password;
        # everyone over TCP needs one
        self._check(self._run("initdb", "-D", str(self.data), "--no-locale", "-E", "UTF8", "--auth-local=trust",
                              "--auth-host=scram-sha-256", "--no-instructions"), "initdb")
        for attempt in range(3):  # the free port may be taken between asking and listening: try another
            self.port = _free_port()
            settings = {"listen_addresses": "'127.0.0.1'", "port": self.port,
                        "unix_socket_directories": f"'{self.sockets}'", "fsync": "off",
                        "synchronous_commit": "off", "full_page_writes": "off", "max_connections": 50,
                        "shared_buffers": "'32MB'"}
            with open(self.data / "postgresql.auto.conf", "a") as fh:  # the server user owns it; root may append
                fh.writelines(f"{k} = {v}\n" for k, v in settings.items())
            proc = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60", "start")
            if proc.returncode == 0:
                break
            if attempt == 2 or "could not bind" not in self.logfile.read_text(errors="replace"):
                self._check(proc, "pg_ctl start")
        self.started = True
        self._make_user()

    def _superuser(self) -> str:
        if self.as_root:
            return SERVER_USER
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name

    def _admin(self):
        """A superuser connection over the unix socket (no password), autocommit."""
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                return psycopg.connect(host=str(self.sockets), port=self.port, user=self._superuser(),
                                       dbname="postgres", autocommit=True, connect_timeout=5)
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _make_user(self) -> None:
        from psycopg import sql

        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(USER),
                                                                            sql.Literal(self.password)))
        self.database(DB)

    def database(self, name: str) -> str:
        """A new, empty database ``name`` owned by the user; its URL."""
        from psycopg import sql

        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(USER)))
        return self.url_of(name)

    def url_of(self, db: str) -> str:
        return f"postgresql+psycopg://{USER}:{self.password}@127.0.0.1:{self.port}/{db}"

    @property
    def url(self) -> str:
        return self.url_of(DB)

    def stop(self) -> None:
        try:
            if self.started:
                with contextlib.suppress(Exception):
                    self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "stop", timeout=60)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server():
    """A running server (see the module docstring); ``pytest.skip`` when this machine cannot run one."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    server = Server(server_binaries()[0])
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pg_server():
    """The running ``Server`` (``.url``, ``.password``, ``.database(name)`` for another empty database)."""
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="module")
def pg_url(pg_server) -> str:
    """``postgresql+psycopg://USER:PASSWORD@127.0.0.1:PORT/DB`` of a throwaway server."""
    return pg_server.url
