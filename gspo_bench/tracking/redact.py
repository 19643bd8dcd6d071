"""Credentials never leave the process: ``redact`` masks them as ``***`` in everything written out.

What is masked, wherever it occurs in a text:

- the password of a URI's userinfo, ``scheme://user:password@host`` ->
  ``scheme://user:***@host`` (MLflow ``--tracking-uri``, Optuna ``--storage``,
  a model registry; any scheme, ``postgresql+psycopg://`` included). A user
  without a password (``postgresql://nobody@host``) is not a secret and stays;
- the value of a query parameter whose name ends in ``password``, ``passwd``,
  ``pwd``, ``token``, ``secret`` or ``api_key``/``apikey``
  (``?sslpassword=...&x_token=...``) -> ``?sslpassword=***&x_token=***``;
- the value of every environment variable whose name ends in ``_PASSWORD``
  or ``_TOKEN`` (``MLFLOW_TRACKING_PASSWORD``, ``HF_TOKEN``), as typed and
  percent-encoded, when it is at least ``MIN_SECRET_LEN`` characters long
  (shorter values, e.g. ``0`` or ``no``, would mask ordinary words and hide
  nothing worth hiding).

Why: the command line, the tracking URI and the storage URL are recorded on
purpose (MLflow params and ``config.yaml``, ``report.md``'s command line,
the best-params YAML's ``source:``, console lines) so a result can be traced
to how it was made; a password or token inside them must not be. Only what
is *written out* is masked: callers keep the real URI to connect with.

``redact`` is the one function that does this; ``redact_nested`` applies it
to every string of a params / config dict, and ``RedactingConsole`` to every
line the command line prints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from rich.console import Console

MASK = "***"
MIN_SECRET_LEN = 4
SECRET_ENV_SUFFIXES = ("_PASSWORD", "_TOKEN")

# userinfo with a password: "://", a user (no ':' '@' '/' '?' '#', may be empty), ':', the password, '@'.
# The password runs to the *last* '@' before the authority ends (whitespace, '/', '?' or '#'), as URL parsers
# read it, so an unencoded '@' inside it is masked too. '"', '<', '>' and '`' never occur unencoded in a URI
# (RFC 3986), so they end the match as well: report.md's `uri` backticks survive.
_USERINFO = re.compile(r"(://[^\s:@/?#\"<>`]*):[^\s/?#\"<>`]*@")
# a query parameter (after '?', '&' or ';') whose name ends in a secret word; its value runs to '&', '#',
# whitespace or a character a URI never holds unencoded. Case-insensitive: ?Password=, &API_KEY= too.
_QUERY_SECRET = re.compile(r"([?&;][\w.-]*?(?:password|passwd|pwd|token|secret|api[_-]?key)=)[^&#\s\"<>`]*",
                           re.IGNORECASE)


def _env_secrets(env: Mapping[str, str]) -> list[str]:
    """Values (and their percent-encoded forms) of ``*_PASSWORD`` / ``*_TOKEN`` variables, longest first."""
    found = set()
    for name, value in env.items():
        if name.upper().endswith(SECRET_ENV_SUFFIXES) and value and len(value.strip()) >= MIN_SECRET_LEN:
            found.update({value, quote(value, safe=""), quote(value, safe="/")})
    return sorted(found, key=len, reverse=True)  # longest first: a value containing another is masked whole


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """``text`` with every credential (see the module docstring) replaced by ``***``; idempotent.

    ``env`` defaults to ``os.environ``. Anything not a ``str`` is returned as it is.
    """
    if not isinstance(text, str) or not text:
        return text
    secrets = _env_secrets(os.environ if env is None else env)
    if secrets:  # first: a secret that is also a URI's password is then already ***, which the URI rule keeps
        text = re.sub("|".join(map(re.escape, secrets)), MASK, text)
    text = _USERINFO.sub(rf"\1:{MASK}@", text)
    return _QUERY_SECRET.sub(rf"\1{MASK}", text)


def redact_nested(obj: Any, env: Mapping[str, str] | None = None) -> Any:
    """A copy of ``obj`` with ``redact`` applied to every string in it (dict keys and values, list and tuple
    items, at any depth); other values are kept as they are."""
    if env is None:
        env = dict(os.environ)  # one snapshot for the whole tree
    if isinstance(obj, str):
        return redact(obj, env)
    if isinstance(obj, Mapping):
        return {redact_nested(k, env): redact_nested(v, env) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_nested(x, env) for x in obj)
    return obj


class RedactingConsole(Console):
    """A Rich console that passes everything it prints through ``redact``.

    Strings given to ``print`` are redacted before Rich wraps them (a long URI split over two lines would
    escape a check of the rendered lines); whatever else is rendered (tables, panels) is redacted as the
    final text, just before it is written.
    """

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(redact(o) if isinstance(o, str) else o for o in objects), **kwargs)

    def _render_buffer(self, buffer) -> str:  # Rich's last step before the text reaches the terminal
        return redact(super()._render_buffer(buffer))
