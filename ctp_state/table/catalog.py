"""Where a topic's Iceberg table is registered: the catalog, and the table itself.

A topic incarnation is one Iceberg table, ``<namespace>.<topic>`` (the identifier is
the pair, so a dot in a topic name is not a namespace level), whose metadata lives in
the store beside the topic's other state (``tables/<space>/``) and whose data files are
the topic's committed L1 files, registered where they are. The catalog is a setting:

- a SQLAlchemy URL (``sqlite:////path/catalog.db``, ``postgresql+psycopg://...``) for
  pyiceberg's SQL catalog, or an ``http(s)://`` URI for a REST catalog;
- by default a SQLite file: beside a local store (``<root>.catalog.db``), or
  under ``~/.ctp/catalogs/`` for an S3 store (one machine only: share a PostgreSQL
  catalog between Airflow workers).

The catalog URI may hold a password: it is never logged or put in an error
(:func:`ctp_state.storage.settings.redact_url`).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from ctp_state import layout
from ctp_state.errors import ConfigError
from ctp_state.storage import ObjectStore
from ctp_state.storage.settings import redact_url
from ctp_state.topic_meta import Topic

#: Table properties ctp sets: the incarnation the table belongs to, and no commit
#: retries (pyiceberg would rebase a conflicting append onto the new head, and a racing
#: publisher could then register a file twice; ctp recomputes instead).
TOPIC_ID = "ctp.topic_id"
_NAMESPACE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
NO_RETRIES = {"commit.retry.num-retries": "0"}


@dataclass(frozen=True)
class CatalogConfig:
    """How to reach the catalog. ``uri`` None: the default SQLite file for the store."""

    uri: str | None = None
    namespace: str = "ctp"

    def __post_init__(self) -> None:
        # It names a directory under the topic's space in the store, and an Iceberg
        # namespace level: a letter first, then letters, digits and underscores.
        if not _NAMESPACE_RE.fullmatch(self.namespace):
            raise ConfigError(
                f"table namespace {self.namespace!r} must be 1-64 letters, digits and underscores, "
                "starting with a letter (--namespace, $CTP_TABLE_NAMESPACE)"
            )

    def __repr__(self) -> str:  # the URI may hold a password
        return f"CatalogConfig(uri={redact_url(self.uri) if self.uri else None!r}, namespace={self.namespace!r})"

    @classmethod
    def from_env(cls, env: dict[str, str] | Any) -> CatalogConfig:
        return cls(uri=env.get("CTP_CATALOG_URI") or None, namespace=env.get("CTP_TABLE_NAMESPACE") or "ctp")


def default_path(store: ObjectStore, home: str) -> str:
    """Where the default catalog of ``store`` is: a SQLite file (``home``: the user's home)."""
    root: str | None = getattr(store, "root", None)
    if root is not None:  # beside the store's directory, not among its keys
        return root.rstrip("/") + ".catalog.db"
    digest = hashlib.sha256(store.url.encode()).hexdigest()[:16]
    return os.path.join(home, ".ctp", "catalogs", f"{digest}.db")


def default_uri(store: ObjectStore, home: str) -> str:
    path = default_path(store, home)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return "sqlite:///" + path


def file_io_properties(store: ObjectStore) -> dict[str, str]:
    """What pyiceberg's FileIO needs to read and write the store's files."""
    settings = getattr(store, "_settings", None)
    if settings is None:
        return {}
    props = {"s3.region": settings.region or "us-east-1"}
    if settings.endpoint_url:
        props["s3.endpoint"] = settings.endpoint_url
    if settings.access_key_id:
        props["s3.access-key-id"] = settings.access_key_id
    if settings.secret_access_key:
        props["s3.secret-access-key"] = settings.secret_access_key
    if settings.session_token:
        props["s3.session-token"] = settings.session_token
    return props


def open_catalog(store: ObjectStore, config: CatalogConfig, *, home: str) -> Any:
    """The pyiceberg catalog ``config`` names, with the store's FileIO settings."""
    uri = config.uri or default_uri(store, home)
    props = {**file_io_properties(store), "warehouse": store.url}
    for attempt in range(3):
        try:
            if uri.startswith(("http://", "https://")):
                from pyiceberg.catalog.rest import RestCatalog

                return RestCatalog("ctp", uri=uri, **props)
            from ctp_state.table.sql_catalog import sql_catalog_class

            # (creates its own tables if absent: two processes doing that at once
            # collide, and the loser finds them on its next attempt)
            return sql_catalog_class()("ctp", uri=uri, **props)
        except ImportError as e:
            raise ConfigError(f"the Iceberg catalog needs pyiceberg with its SQL extras ({e})") from None
        except Exception as e:
            if attempt == 2:
                raise ConfigError(
                    f"cannot open the Iceberg catalog {redact_url(uri)}: {type(e).__name__}: {_scrub(str(e), uri)}"
                ) from None
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _scrub(message: str, uri: str) -> str:
    """``message`` without ``uri``'s password, should a driver have quoted it."""
    from urllib.parse import urlparse

    password = urlparse(uri).password
    return message.replace(password, "***") if password else message


def identifier(config: CatalogConfig, topic: str) -> tuple[str, str]:
    return (config.namespace, topic)


def location(store: ObjectStore, t: Topic) -> str:
    """Where the incarnation's table metadata lives in the store."""
    return uri_of(store, f"{layout.TABLES_ROOT}{layout.space(t.name, t.key_id)}")


def uri_of(store: ObjectStore, key: str) -> str:
    """The URI pyiceberg and the engines reading the table know a store key by."""
    return store.url.rstrip("/") + "/" + key
