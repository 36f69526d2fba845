"""Where the check history lives: a SQLite file (the embedded default) or a PostgreSQL URL, and how to name it
in messages without its password.

``--store PATH|URL``, else ``$EDGETK_STORE``, else ``$XDG_DATA_HOME/edgetk/history.sqlite``, else
``~/.local/share/edgetk/history.sqlite``. A value with ``://`` is a URL: ``postgresql://user[:pw]@host[:port]/db``
(driven by psycopg 3; ``postgresql+psycopg://`` is the same) or ``sqlite:///path``. Anything else is a file path.
A password may also come from ``PGPASSWORD`` or ``~/.pgpass`` (libpq reads them), which keeps it out of shell
history. :attr:`StoreLocation.display` is the one form of the location that messages, logs and JSON use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.errors import UsageError

_PG_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")


def default_store_path() -> Path:
    """The default history file (``$EDGETK_STORE`` when it is a path)."""
    env = os.environ.get("EDGETK_STORE")
    if env and "://" not in env:
        return Path(env).expanduser()
    return _data_dir() / "history.sqlite"


def fallback_store_path() -> Path:
    """The local SQLite file that ``--store-fallback`` writes to and ``edgetk history sync`` empties."""
    return _data_dir() / "unsynced.sqlite"


def _data_dir() -> Path:
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "edgetk"


@dataclass(frozen=True)
class StoreLocation:
    """A parsed store location. ``url`` (with any password) goes to SQLAlchemy only; ``display`` everywhere else."""

    url: str = field(repr=False)
    display: str
    path: Path | None  # the SQLite file; None for a server
    secret: str | None = field(default=None, repr=False)  # the URL's password, scrubbed from driver messages

    @property
    def is_sqlite(self) -> bool:
        return self.path is not None

    def scrub(self, text: str) -> str:
        """``text`` with the password (raw and URL-quoted) replaced by ``***``."""
        from urllib.parse import quote

        if self.secret:
            for form in {self.secret, quote(self.secret, safe="")}:
                text = text.replace(form, "***")
        return text

    def __str__(self) -> str:
        return self.display


def _sqlite(path: Path) -> StoreLocation:
    path = path.expanduser()
    return StoreLocation(url=f"sqlite:///{path}", display=str(path), path=path)


def parse_location(value: str | os.PathLike[str] | None) -> StoreLocation:
    """``--store``'s value (or ``$EDGETK_STORE``, or the default file) -> a StoreLocation."""
    if value is None:
        env = os.environ.get("EDGETK_STORE")
        value = env if env else default_store_path()
    text = os.fspath(value)
    if "://" not in text:
        if not text.strip():
            raise UsageError("--store needs a file path or a postgresql:// URL.")
        return _sqlite(Path(text))
    from sqlalchemy.engine import URL, make_url
    from sqlalchemy.exc import ArgumentError

    scheme = text.split("://", 1)[0].lower()
    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        raise UsageError(
            f"--store {redact(text)!r} is not a valid URL.",
            hint="Use postgresql://USER@HOST:PORT/DATABASE (password from PGPASSWORD or ~/.pgpass) or a file path.",
        ) from None
    if scheme == "sqlite":
        if not url.database:
            raise UsageError("--store sqlite:// needs a file: sqlite:////absolute/path.sqlite or a plain path.")
        return _sqlite(Path(url.database))
    if scheme not in _PG_SCHEMES:
        raise UsageError(
            f"--store {redact(text)!r}: the database kind {scheme!r} is not supported.",
            hint="Use a file path (SQLite) or postgresql://USER@HOST:PORT/DATABASE.",
        )
    if not url.database:
        raise UsageError(f"--store {redact(text)!r} names no database.", hint="Add it: postgresql://USER@HOST:PORT/DB")
    driver = url.set(drivername="postgresql+psycopg")
    shown = URL.create("postgresql", username=url.username, host=url.host, port=url.port, database=url.database)
    return StoreLocation(
        url=driver.render_as_string(hide_password=False), display=shown.render_as_string(hide_password=True),
        path=None, secret=url.password or None,
    )


def redact(text: str) -> str:
    """A URL-ish string with the password part (``user:PASSWORD@``) removed."""
    if "://" not in text:
        return text
    scheme, rest = text.split("://", 1)
    netloc, sep, tail = rest.partition("/")
    if "@" in netloc:
        creds, _, hostpart = netloc.rpartition("@")
        netloc = creds.split(":", 1)[0] + "@" + hostpart
    return f"{scheme}://{netloc}{sep}{tail}"
