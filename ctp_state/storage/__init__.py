"""Storage: the object-store interface and its backends, chosen by URL scheme.

- :mod:`.base` -- the interface (:class:`ObjectStore`) and its value types;
- :mod:`.registry` -- :func:`open_store`, backends by scheme;
- :mod:`.local` -- ``file:///path`` (atomic create by ``link(2)``);
- :mod:`.s3` -- ``s3://bucket/prefix`` (atomic create by ``If-None-Match: *``);
- :mod:`.settings` -- :class:`S3Settings` from a mapping, URL redaction.
"""

from ctp_state.storage.base import MAX_DELETE_BATCH, DeleteResult, ObjectInfo, ObjectStore, check_key
from ctp_state.storage.local import LocalStore
from ctp_state.storage.registry import SCHEMES, open_store, register
from ctp_state.storage.s3 import S3Store
from ctp_state.storage.settings import S3Settings, redact_url

__all__ = [
    "MAX_DELETE_BATCH",
    "SCHEMES",
    "DeleteResult",
    "LocalStore",
    "ObjectInfo",
    "ObjectStore",
    "S3Settings",
    "S3Store",
    "check_key",
    "open_store",
    "redact_url",
    "register",
]
