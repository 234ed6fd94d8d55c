"""Great Expectations, imported without loading two libraries the gate never calls.

Every ``ctp gc`` process (and every Airflow GC task) imports GX, and that import took
about 3 s, a quarter of it loading scipy.stats and altair for one expectation ctp does
not use (KL divergence; its module binds both names when GX registers it). While GX is
imported here, those two modules are *lazy* (:class:`importlib.util.LazyLoader`): they
load on the first use of one of their attributes, so code that does use them works as
before, and the gate, which never does, skips loading them (0.85 s a process on the
machine of the figures). Anything else imports normally; a module already loaded is
left as it is.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType

#: Imported by GX on its import, used by none of the expectations in ``suites``.
LAZY = ("scipy.stats", "altair")


class _LazyFinder(importlib.abc.MetaPathFinder):
    """Finds ``names`` as every other finder would, and loads them lazily."""

    def __init__(self, names: Sequence[str]):
        self.names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if isinstance(spec.loader, importlib.abc.Loader) and hasattr(spec.loader, "exec_module"):
                spec.loader = importlib.util.LazyLoader(spec.loader)
            return spec
        return None


@contextmanager
def lazily(names: Sequence[str] = LAZY) -> Iterator[None]:
    """Modules in ``names`` first imported inside the block load on first use."""
    finder = _LazyFinder(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


with lazily():
    import great_expectations as gx
    import great_expectations.expectations as gxe

__all__ = ["LAZY", "gx", "gxe", "lazily"]
