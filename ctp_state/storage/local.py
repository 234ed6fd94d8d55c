"""The local-filesystem backend: ``file:///absolute/path``."""

from __future__ import annotations

import builtins
import errno
import os
import stat
import time
import uuid
from collections.abc import Iterator, Mapping
from urllib.parse import ParseResult

from ctp_state.errors import ConfigError, CorruptData, KeyExists, ObjectNotFound, StoreError, StoreNotFound
from ctp_state.storage.base import DeleteResult, ObjectInfo, ObjectStore, check_key
from ctp_state.storage.settings import redact_url

_TMP_DIR = ".ctp-tmp"
#: The first read of a get: most objects of a store (log entries, snapshots) are smaller.
_FIRST_READ = 1 << 16


class LocalStore(ObjectStore):
    """A store in a local directory. Atomic create is ``link(2)`` of a fully written,
    fsynced temporary file: it fails with EEXIST if the key exists, and a reader never
    sees a partial object. Works on any POSIX filesystem, including NFS."""

    delete_concurrency = 1  # see ObjectStore.delete_concurrency
    read_concurrency = 1
    write_concurrency = 4

    def __init__(self, root: str, *, fsync: bool = True, create: bool = True):
        if not os.path.isabs(root):
            raise ConfigError(f"file store path must be absolute, got {root!r}")
        self.root = os.path.normpath(root)
        self.url = "file://" + self.root
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise ConfigError(f"file store {self.url} is not a directory")
        if not create and not os.path.isdir(self.root):
            raise StoreNotFound(self.url, "no such directory")
        self._fsync = fsync
        self._prefix = os.path.join(self.root, "")  # the root and a separator
        self._tmp = os.path.join(self.root, _TMP_DIR)
        os.makedirs(self._tmp, exist_ok=True)

    def key_of(self, uri: str) -> str | None:
        key = super().key_of(uri)
        if key is not None or not uri.startswith("file://"):
            return key
        # Another spelling of the root (a symlink on the way to it, or to one of its parts):
        # the same file is the same key.
        real, root = os.path.realpath(uri[len("file://") :]), os.path.realpath(self.root)
        if not real.startswith(root + os.sep):
            return None
        return real[len(root) + 1 :].replace(os.sep, "/")

    def _path(self, key: str) -> str:
        if os.sep == "/":  # a checked key's parts are joined by the separator it has
            return self._prefix + check_key(key)
        return os.path.join(self.root, *check_key(key).split("/"))

    def get(self, key: str) -> bytes:
        # os.open and os.read, not open(): a buffered file object costs an fstat, an
        # ioctl and a seek besides, and the GC and the reconciler read every partition's
        # entries one small file at a time (200,000 entries: 1.3 s against 2.7 s).
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(key) from None
        try:
            data = os.read(fd, _FIRST_READ)
            if len(data) < _FIRST_READ and not (more := os.read(fd, _FIRST_READ)):
                return data  # (a short read is the end of a file: the next read says so)
            parts = [data] if len(data) == _FIRST_READ else [data, more]
            while chunk := os.read(fd, 1 << 20):
                parts.append(chunk)
            return b"".join(parts)
        except IsADirectoryError:  # (opening a directory read-only succeeds; reading it does not)
            raise ObjectNotFound(key) from None
        finally:
            os.close(fd)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise StoreError(f"invalid range start={start} length={length} for {key!r}")
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read(length)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(key) from None

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        if length <= 0:
            raise StoreError(f"invalid tail length {length} for {key!r}")
        try:
            with open(self._path(key), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - length))
                return f.read(length), size
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(key) from None

    def head(self, key: str) -> ObjectInfo | None:
        try:
            st = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def _write_tmp(self, data: bytes) -> str:
        tmp = os.path.join(self._tmp, uuid.uuid4().hex)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def _install(self, key: str, data: bytes, exclusive: bool) -> None:
        dst = self._path(key)
        tmp = self._write_tmp(data)
        try:
            for _ in range(8):
                try:
                    if exclusive:
                        os.link(tmp, dst)
                    else:
                        os.replace(tmp, dst)
                    break
                except FileNotFoundError:
                    if not os.path.exists(tmp):  # nothing was written under the key
                        raise StoreError(
                            f"writing {key!r}: its temporary file was removed before it was linked "
                            "(by a temporary-file sweep with a very short age?)"
                        ) from None
                    # The parent directory is missing, or a concurrent delete pruned it
                    # between makedirs and link: recreate and try again.
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                except FileExistsError:
                    raise KeyExists(key) from None
            else:  # pragma: no cover - needs 8 lost races with directory pruning
                raise StoreError(f"could not create parent directory of {key!r}")
            if self._fsync:
                self._fsync_dir(os.path.dirname(dst))
        finally:
            if exclusive or os.path.exists(tmp):
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass

    @staticmethod
    def _fsync_dir(path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def put(self, key: str, data: bytes) -> None:
        self._install(key, data, exclusive=False)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._install(key, data, exclusive=True)

    def list(
        self, prefix: str = "", start_after: str | None = None, end_before: str | None = None
    ) -> Iterator[ObjectInfo]:
        # Walk the tree lazily. Sorting a directory's children by name, with '/'
        # appended to directory names, yields exactly the byte-wise order of full
        # keys, so the walk matches S3's ListObjectsV2 order without sorting all keys.
        base, _, _ = prefix.rpartition("/")
        start_dir = os.path.join(self.root, *base.split("/")) if base else self.root
        yield from self._walk(start_dir, base + "/" if base else "", prefix, start_after or "", end_before)

    def _walk(self, path: str, key_prefix: str, prefix: str, after: str, before: str | None) -> Iterator[ObjectInfo]:
        # The part of `after` below this directory: a child whose name sorts at or before
        # it, and is not a beginning of it, holds nothing past `after` (file or directory).
        # Dropped before the sort: a state log's directory holds every entry, and a read
        # lists only the few after the newest snapshot.
        # (Names are compared as they come, before the UTF-8 check and the type lookup,
        # which only the kept ones need: the per-entry cost of a long log's directory. The
        # beginnings of `here` a name can be are those of its first part, as a set.)
        here = after[len(key_prefix) :] if after and after.startswith(key_prefix) else ""
        first = here.partition("/")[0]
        beginnings = {first[:i] for i in range(1, len(first) + 1)}
        try:
            with os.scandir(path) as it:
                kept = [e for e in it if e.name > here or e.name in beginnings] if here else list(it)
        except (FileNotFoundError, NotADirectoryError):
            return
        entries = [(_utf8(key_prefix, e.name) + ("/" if e.is_dir(follow_symlinks=False) else ""), e) for e in kept]
        entries.sort(key=lambda pair: pair[0].encode())
        for sort_name, entry in entries:
            key = key_prefix + sort_name
            if before is not None and key >= before:
                return  # in key order: this entry and everything after it (and below it) sorts after the bound
            if not key_prefix and sort_name == _TMP_DIR + "/":
                continue
            if sort_name.endswith("/"):
                # Every key below starts with `key`; skip subtrees entirely outside
                # the prefix or entirely at/before `after`.
                if not (key.startswith(prefix) or prefix.startswith(key)):
                    continue
                if after and key < after and not after.startswith(key):
                    continue
                yield from self._walk(entry.path, key, prefix, after, before)
            else:
                if not key.startswith(prefix) or key <= after:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # deleted while listing
                    continue
                yield ObjectInfo(key, st.st_size, st.st_mtime)

    def list_level(self, prefix: str) -> tuple[builtins.list[str], builtins.list[ObjectInfo]]:
        if prefix and not prefix.endswith("/"):
            raise StoreError(f"list_level needs a prefix ending in '/', got {prefix!r}")
        path = os.path.join(self.root, *prefix.rstrip("/").split("/")) if prefix else self.root
        dirs: builtins.list[str] = []
        files: builtins.list[ObjectInfo] = []
        try:
            with os.scandir(path) as it:
                for e in it:
                    _utf8(prefix, e.name)
                    if e.is_dir(follow_symlinks=False):
                        if prefix or e.name != _TMP_DIR:
                            dirs.append(prefix + e.name + "/")
                    else:
                        st = e.stat(follow_symlinks=False)
                        files.append(ObjectInfo(prefix + e.name, st.st_size, st.st_mtime))
        except FileNotFoundError:
            return [], []
        return sorted(dirs, key=str.encode), sorted(files, key=lambda o: o.key.encode())

    def _delete_batch(self, keys: builtins.list[str]) -> DeleteResult:
        deleted: builtins.list[str] = []
        errors: dict[str, str] = {}
        parents: set[str] = set()
        for key in keys:
            path = self._path(key)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                errors[key] = e.strerror or type(e).__name__
                continue
            deleted.append(key)
            parents.add(os.path.dirname(path))
        # Empty directories go once per batch, deepest first: a batch of one epoch's keys
        # tries one rmdir, not one per key.
        for parent in sorted(parents, key=lambda p: p.count(os.sep), reverse=True):
            self._prune_dirs(parent)
        return DeleteResult(tuple(deleted), errors)

    def sweep_temporary(self, older_than_s: float, now_s: float | None = None) -> int:
        """Temporary files of writes killed between writing and linking (``kill -9``,
        a machine failure) are never linked: delete those older than ``older_than_s``.
        A live write holds its temporary file for milliseconds; the GC's default age is
        an hour. One that goes missing under a live write only fails that write."""
        now = time.time() if now_s is None else now_s
        n = 0
        try:
            names = os.listdir(self._tmp)
        except FileNotFoundError:
            return 0
        for name in names:
            path = os.path.join(self._tmp, name)
            try:
                if now - os.stat(path).st_mtime >= older_than_s:
                    os.unlink(path)
                    n += 1
            except OSError:  # its write finished meanwhile, another sweep took it, or it is not ours
                continue
        return n

    def _prune_dirs(self, path: str) -> None:
        while path != self.root and path.startswith(self.root):
            try:
                os.rmdir(path)
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
                    return
                raise
            path = os.path.dirname(path)


def _utf8(key_prefix: str, name: str) -> str:
    """``name`` if it is valid UTF-8 (every key ctp writes is); a file name that is not
    (a stray file) is :class:`CorruptData` naming it, not an encoding error deep in a
    listing."""
    try:
        name.encode()
    except UnicodeEncodeError:
        shown = (key_prefix + name).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise CorruptData(shown, "file name in the store is not valid UTF-8 (not a key ctp writes)") from None
    return name


def open_local(parsed: ParseResult, url: str, env: Mapping[str, str], create: bool = True) -> LocalStore:
    """The opener the registry calls for ``file://`` URLs. ``CTP_FSYNC=0`` turns off
    fsync (tests and benchmarks on throwaway stores only)."""
    if parsed.netloc not in ("", "localhost"):
        raise ConfigError(f"file store URL must be file:///absolute/path, got {redact_url(url)!r}")
    if not parsed.path.startswith("/"):
        raise ConfigError(f"file store URL must be file:///absolute/path, got {url!r}")
    fsync = env.get("CTP_FSYNC", "1") not in ("0", "false", "no")
    return LocalStore(parsed.path, fsync=fsync, create=create)
