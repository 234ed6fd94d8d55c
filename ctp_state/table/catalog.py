"""Where a topic's Iceberg table is registered: the catalog, and the table itself.

A topic incarnation is one Iceberg table, ``<namespace>.<topic>`` (the identifier is
the pair, so a dot in a topic name is not a namespace level), whose metadata lives in
the store beside the topic's other state (``tables/<space>/``) and whose data files are
the topic's committed L1 files, registered where they are. The catalog is a setting:

- a SQLAlchemy URL (``sqlite:////path/catalog.db``, ``postgresql+psycopg://...``) for
  pyiceberg's SQL catalog, or an ``http(s)://`` URI for a REST catalog, which decides
  where a table's metadata lives (its warehouse; ctp's published vectors stay in the
  store, under ``tables/<space>/``);
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ctp_state import layout
from ctp_state.errors import ConfigError
from ctp_state.storage import ObjectStore
from ctp_state.storage.settings import S3Settings, redact_url
from ctp_state.topic_meta import Topic

#: Table properties ctp sets: the incarnation the table belongs to, and no commit
#: retries (pyiceberg would rebase a conflicting append onto the new head, and a racing
#: publisher could then register a file twice; ctp recomputes instead).
TOPIC_ID = "ctp.topic_id"
_NAMESPACE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
NO_RETRIES = {"commit.retry.num-retries": "0"}
#: A REST catalog's table keeps its metadata in the catalog's warehouse, where ctp
#: deletes nothing: the catalog drops metadata files past the newest ten on each commit
#: (what Iceberg's writers do with these properties), and expired snapshots' manifests
#: are the catalog's (its orphan-file cleanup) -- docs/tables.md, "Keeping it small".
REST_PROPERTIES = {"write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "10"}


#: How ctp authenticates to a REST catalog (``CTP_CATALOG_AUTH``): AWS SigV4 with the
#: store's S3 credentials (S3 Tables, Glue, SeaweedFS), a bearer token, OAuth2 client
#: credentials (Polaris, Lakekeeper, Unity, Nessie), or nothing.
REST_AUTH = ("sigv4", "token", "oauth2", "none")


@dataclass(frozen=True)
class CatalogConfig:
    """How to reach the catalog. ``uri`` None: the default SQLite file for the store.

    For a REST catalog (an ``http(s)://`` URI): ``warehouse`` (as the catalog names it),
    ``auth`` (one of :data:`REST_AUTH`; default ``sigv4`` when the store has S3
    credentials, else ``none``), a ``token`` or a ``credential`` (``client_id:secret``)
    with ``oauth2_uri`` and ``scope``, and SigV4's ``signing_name`` and
    ``signing_region``. Secrets never appear in its ``repr``."""

    uri: str | None = None
    namespace: str = "ctp"
    warehouse: str | None = None
    auth: str | None = None
    token: str | None = field(default=None, repr=False)
    credential: str | None = field(default=None, repr=False)
    oauth2_uri: str | None = None
    scope: str | None = None
    signing_name: str = "s3tables"
    signing_region: str | None = None
    #: How to reach the warehouse's object store (read and write a REST table's
    #: manifests, sign its requests): the same S3 settings an S3 store takes
    #: (``CTP_S3_*``, ``AWS_*``); the store's own when it is on S3.
    s3: S3Settings | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # It names a directory under the topic's space in the store, and an Iceberg
        # namespace level: a letter first, then letters, digits and underscores.
        if not _NAMESPACE_RE.fullmatch(self.namespace):
            raise ConfigError(
                f"table namespace {self.namespace!r} must be 1-64 letters, digits and underscores, "
                "starting with a letter (--namespace, $CTP_TABLE_NAMESPACE)"
            )
        if self.auth is not None and self.auth not in REST_AUTH:
            raise ConfigError(f"catalog auth {self.auth!r} must be one of {', '.join(REST_AUTH)} ($CTP_CATALOG_AUTH)")
        if self.is_rest:
            if not self.warehouse:
                raise ConfigError(
                    f"the REST catalog {redact_url(self.uri or '')} needs a warehouse ($CTP_CATALOG_WAREHOUSE, "
                    "--catalog-warehouse): the name the catalog gives it"
                )
            if self.auth == "token" and not self.token:
                raise ConfigError(
                    "catalog auth 'token' needs a token ($CTP_CATALOG_TOKEN, or the ctp_catalog connection)"
                )
            if self.auth == "oauth2" and not (self.credential and ":" in self.credential):
                raise ConfigError(
                    "catalog auth 'oauth2' needs client credentials as client_id:secret ($CTP_CATALOG_CREDENTIAL, "
                    "or the ctp_catalog connection's login and password)"
                )
        elif self.uri is not None and (self.warehouse or self.auth):
            raise ConfigError("a catalog warehouse and auth apply to a REST catalog (an http(s):// CTP_CATALOG_URI)")

    @property
    def is_rest(self) -> bool:
        return bool(self.uri) and self.uri.startswith(("http://", "https://"))  # type: ignore[union-attr]

    def __repr__(self) -> str:  # the URI may hold a password; token and credential are secrets
        return (
            f"CatalogConfig(uri={redact_url(self.uri) if self.uri else None!r}, namespace={self.namespace!r}"
            + (f", warehouse={self.warehouse!r}, auth={self.auth!r}" if self.is_rest else "")
            + ")"
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CatalogConfig:
        """From ``CTP_CATALOG_URI``, ``CTP_TABLE_NAMESPACE`` and, for a REST catalog,
        ``CTP_CATALOG_WAREHOUSE``, ``CTP_CATALOG_AUTH``, ``CTP_CATALOG_TOKEN``,
        ``CTP_CATALOG_CREDENTIAL``, ``CTP_CATALOG_OAUTH2_URI``, ``CTP_CATALOG_SCOPE``,
        ``CTP_CATALOG_SIGNING_NAME`` and ``CTP_CATALOG_SIGNING_REGION``."""
        return cls(
            uri=env.get("CTP_CATALOG_URI") or None,
            namespace=env.get("CTP_TABLE_NAMESPACE") or "ctp",
            warehouse=env.get("CTP_CATALOG_WAREHOUSE") or None,
            auth=env.get("CTP_CATALOG_AUTH") or None,
            token=env.get("CTP_CATALOG_TOKEN") or None,
            credential=env.get("CTP_CATALOG_CREDENTIAL") or None,
            oauth2_uri=env.get("CTP_CATALOG_OAUTH2_URI") or None,
            scope=env.get("CTP_CATALOG_SCOPE") or None,
            signing_name=env.get("CTP_CATALOG_SIGNING_NAME") or "s3tables",
            signing_region=env.get("CTP_CATALOG_SIGNING_REGION") or None,
            s3=S3Settings.from_env(env)
            if (env.get("CTP_CATALOG_URI") or "").startswith(("http://", "https://"))
            else None,
        )

    def as_env(self) -> dict[str, str]:
        """The environment that gives these settings to a child process (secrets
        included: for the child's environment only, never for a log)."""
        pairs = {
            "CTP_CATALOG_URI": self.uri,
            "CTP_TABLE_NAMESPACE": self.namespace,
            "CTP_CATALOG_WAREHOUSE": self.warehouse,
            "CTP_CATALOG_AUTH": self.auth,
            "CTP_CATALOG_TOKEN": self.token,
            "CTP_CATALOG_CREDENTIAL": self.credential,
            "CTP_CATALOG_OAUTH2_URI": self.oauth2_uri,
            "CTP_CATALOG_SCOPE": self.scope,
            "CTP_CATALOG_SIGNING_REGION": self.signing_region,
        }
        env = {k: v for k, v in pairs.items() if v}
        if self.is_rest:
            env["CTP_CATALOG_SIGNING_NAME"] = self.signing_name
        return env

    def rest_properties(self, store: ObjectStore) -> dict[str, str]:
        """pyiceberg ``RestCatalog`` properties: the warehouse, the warehouse's FileIO and
        the authentication."""
        settings: S3Settings | None = getattr(store, "_settings", None) or self.s3
        props = {**s3_file_io_properties(settings), "warehouse": self.warehouse or ""}
        auth = self.auth or ("sigv4" if settings is not None and settings.access_key_id else "none")
        if auth == "sigv4":
            region = self.signing_region or (settings.region if settings is not None else None) or "us-east-1"
            props.update({"rest.sigv4-enabled": "true", "rest.signing-name": self.signing_name})
            props["rest.signing-region"] = region
            props["client.region"] = region
            if settings is not None and settings.access_key_id:
                props["client.access-key-id"] = settings.access_key_id
                props["client.secret-access-key"] = settings.secret_access_key or ""
                if settings.session_token:
                    props["client.session-token"] = settings.session_token
        elif auth == "token":
            props["token"] = self.token or ""
        elif auth == "oauth2":
            props["credential"] = self.credential or ""
            if self.oauth2_uri:
                props["oauth2-server-uri"] = self.oauth2_uri
            if self.scope:
                props["scope"] = self.scope
        return props


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
    return s3_file_io_properties(getattr(store, "_settings", None))


def s3_file_io_properties(settings: S3Settings | None) -> dict[str, str]:
    """pyiceberg FileIO properties for S3 reached with ``settings``."""
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
            if config.is_rest:
                from pyiceberg.catalog.rest import RestCatalog

                return RestCatalog("ctp", uri=uri, **config.rest_properties(store))
            from ctp_state.table.sql_catalog import sql_catalog_class

            # (creates its own tables if absent: two processes doing that at once
            # collide, and the loser finds them on its next attempt)
            return sql_catalog_class()("ctp", uri=uri, **props)
        except ImportError as e:
            raise ConfigError(f"the Iceberg catalog needs pyiceberg with its SQL extras ({e})") from None
        except Exception as e:
            if attempt == 2 or _refused(e):
                raise ConfigError(
                    f"cannot open the Iceberg catalog {redact_url(uri)}: {type(e).__name__}: "
                    f"{_scrub(_scrub(str(e), uri), config.token, config.credential)}"
                ) from None
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _scrub(message: str, uri: str | None, *secrets: str | None) -> str:
    """``message`` without ``uri``'s password or ``secrets``, should a driver have quoted them."""
    from ctp_state.storage.settings import url_password

    for secret in (url_password(uri) if uri else None, *secrets):
        for part in (secret, *(secret.split(":", 1) if secret and ":" in secret else ())):
            if part and len(part) >= 4:
                message = message.replace(part, "***")
    return message


def _refused(e: Exception) -> bool:
    """A catalog that answered no (bad credentials, no such warehouse): asking again
    will not change it."""
    return type(e).__name__ in ("ForbiddenError", "UnauthorizedError", "BadRequestError", "NoSuchNamespaceError")


def identifier(config: CatalogConfig, topic: str) -> tuple[str, str]:
    return (config.namespace, topic)


def location(store: ObjectStore, t: Topic) -> str:
    """Where the incarnation's table metadata lives in the store."""
    return uri_of(store, f"{layout.TABLES_ROOT}{layout.space(t.name, t.key_id)}")


def uri_of(store: ObjectStore, key: str) -> str:
    """The URI pyiceberg and the engines reading the table know a store key by."""
    return store.url.rstrip("/") + "/" + key


def registered_location(catalog: Any, ident: tuple[str, str]) -> str | None:
    """The metadata location a SQL catalog's row names (None for other catalogs)."""
    from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    if not isinstance(catalog, SqlCatalog):
        return None
    with Session(catalog.engine) as session:
        row = session.execute(
            select(IcebergTables.metadata_location).where(
                IcebergTables.catalog_name == catalog.name,
                IcebergTables.table_namespace == ident[0],
                IcebergTables.table_name == ident[1],
            )
        ).first()
    return row[0] if row else None


def drop_if_at(catalog: Any, ident: tuple[str, str], metadata_location: str) -> bool:
    """Drop the table at ``ident`` only if its catalog entry still names
    ``metadata_location``; whether it did. A SQL catalog does it in one conditional
    DELETE; other catalogs are re-read just before an unconditional drop."""
    from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
    from sqlalchemy import delete
    from sqlalchemy.orm import Session

    if isinstance(catalog, SqlCatalog):
        with Session(catalog.engine) as session:
            res = session.execute(
                delete(IcebergTables).where(
                    IcebergTables.catalog_name == catalog.name,
                    IcebergTables.table_namespace == ident[0],
                    IcebergTables.table_name == ident[1],
                    IcebergTables.metadata_location == metadata_location,
                )
            )
            session.commit()
            return bool(getattr(res, "rowcount", 0))
    if catalog.load_table(ident).metadata_location != metadata_location:
        return False
    catalog.drop_table(ident)
    return True
