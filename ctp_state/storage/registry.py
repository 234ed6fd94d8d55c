"""Backends by URL scheme, as pyiceberg resolves a FileIO: a new backend is a new
entry here (or a call to :func:`register`), never a new branch in the callers."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from urllib.parse import ParseResult, urlparse

from ctp_state.errors import ConfigError
from ctp_state.storage.base import ObjectStore
from ctp_state.storage.settings import redact_url

#: ``(parsed URL, URL, environment, create) -> store``; ``create`` is False when the
#: caller only reads: a backend whose stores live in a place it would otherwise create
#: (a local directory) raises :class:`~ctp_state.errors.StoreNotFound` instead.
Opener = Callable[[ParseResult, str, Mapping[str, str], bool], ObjectStore]

#: scheme -> "module:function", imported on first use (boto3 only loads for s3://).
SCHEMES: dict[str, str] = {
    "file": "ctp_state.storage.local:open_local",
    "s3": "ctp_state.storage.s3:open_s3",
}
_OPENERS: dict[str, Opener] = {}


def register(scheme: str, opener: Opener) -> None:
    """Open ``scheme://`` URLs with ``opener`` (replaces a built-in one)."""
    _OPENERS[scheme] = opener


def _opener(scheme: str) -> Opener | None:
    if scheme not in _OPENERS and scheme in SCHEMES:
        module, _, name = SCHEMES[scheme].partition(":")
        _OPENERS[scheme] = getattr(importlib.import_module(module), name)
    return _OPENERS.get(scheme)


def open_store(url: str, env: Mapping[str, str], *, create: bool = True) -> ObjectStore:
    """Open the store named by ``url`` (``file:///abs/path`` or ``s3://bucket/prefix``),
    with settings (S3 endpoint and credentials, fsync) from ``env``: the entry points
    pass their environment; nothing below them reads ``os.environ``.

    ``create=False`` for callers that only read: a ``file://`` store whose directory does
    not exist raises :class:`~ctp_state.errors.StoreNotFound` rather than being created empty (a mistyped
    path would otherwise read as a store with nothing in it). An S3 bucket is never
    created; a missing one fails on the first request."""
    if not url:
        raise ConfigError("no store URL given: pass --store or set CTP_STORE")
    parsed = urlparse(url)
    opener = _opener(parsed.scheme)
    if opener is None:
        known = " or ".join(f"{s}://" for s in sorted({*SCHEMES, *_OPENERS}))
        raise ConfigError(
            f"unsupported store URL {redact_url(url)!r}: use {known} (file:///absolute/path, s3://bucket/prefix)"
        )
    return opener(parsed, url, env, create)
