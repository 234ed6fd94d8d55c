"""Great Expectations' Data Docs page view, with its Jinja templates compiled once.

GX makes a new Jinja environment for every page view it builds, so every gate run
parsed and compiled the same few dozen templates again: about 60% of the time it took
to render a run's Data Docs. :class:`CachedJinjaPageView` is GX's own page view with a
bytecode cache on that environment (Jinja's ``FileSystemBytecodeCache``, in the
user's private temporary directory: templates compile once per GX version and Python,
not once per run; the cache keys on each template's source). The templates and the
pages are GX's own. The gate names the view in its site configuration
(``site_section_builders``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from great_expectations.render.view import DefaultJinjaPageView
from jinja2 import BytecodeCache, FileSystemBytecodeCache
from jinja2.bccache import Bucket

_cache: list[BytecodeCache | None] = []  # one per process, made on first use


class QuietBytecodeCache(FileSystemBytecodeCache):
    """Jinja's file cache, except that a cache file it cannot read or write (its
    directory removed by a temporary-file cleaner, a full disk) means compiling the
    template, never a page that fails to render."""

    def load_bytecode(self, bucket: Bucket) -> None:
        with contextlib.suppress(OSError):
            super().load_bytecode(bucket)

    def dump_bytecode(self, bucket: Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


def bytecode_cache() -> BytecodeCache | None:
    """Jinja's file cache in its default directory (private to the user); None (compile
    as before) where the temporary directory cannot hold one."""
    if not _cache:
        try:
            _cache.append(QuietBytecodeCache())
        except (OSError, RuntimeError):  # no usable temporary directory: no cache
            _cache.append(None)
    return _cache[0]


class CachedJinjaPageView(DefaultJinjaPageView):  # type: ignore[misc]
    """GX's :class:`DefaultJinjaPageView`, its templates' bytecode cached."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env.bytecode_cache = bytecode_cache()


def section_views() -> dict[str, Any]:
    """The section views of the gate's Data Docs site (GX's ``site_section_builders``),
    a fresh copy for each context GX may change."""
    return {
        section: {"view": {"module_name": __name__, "class_name": CachedJinjaPageView.__name__}}
        for section in ("expectations", "validations")
    }
