"""The object-store interface and its two real backends.

Storage sits behind a few verbs: get, ranged get, put, put-if-absent (atomic
create), list in key order after a key, and delete many. Backends are chosen by URL
scheme (``file:///abs/path`` or ``s3://bucket/prefix``). Keys are ``/``-separated and
relative to the store's root; both backends list them in the same (byte-wise) order,
which is what makes epoch-ordered L0 listings and dense state-log offsets work.

The S3 adapter turns 412/409 on a conditional write into one :class:`KeyExists`, once;
callers reload, re-apply and retry a bounded number of times.
"""

from __future__ import annotations

import errno
import os
import stat
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from ctp_state.errors import ConfigError, InvalidKey, KeyExists, ObjectNotFound, StoreError

#: S3 rejects a DeleteObjects request of more than 1000 keys; moto does not, so the
#: limit is enforced here.
MAX_DELETE_BATCH = 1000


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float  # seconds since the epoch, as the store reports it


@dataclass(frozen=True, slots=True)
class DeleteResult:
    deleted: tuple[str, ...] = ()
    errors: Mapping[str, str] = field(default_factory=dict)  # key -> reason


def check_key(key: str) -> str:
    """Refuse keys that could escape the store root or that backends disagree on."""
    if not key or key.startswith("/") or key.endswith("/"):
        raise InvalidKey(key, "must be non-empty and must not start or end with '/'")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidKey(key, "must not contain empty, '.' or '..' parts")
    if "\x00" in key or "\\" in key:
        raise InvalidKey(key, "must not contain NUL or backslash")
    return key


class ObjectStore(ABC):
    """A key-value object store with atomic create. Thread-safe."""

    url: str  # redacted: never carries credentials

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Return the object's bytes; raise :class:`ObjectNotFound` if it is absent."""

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Return ``length`` bytes from ``start`` (fewer only at the end of the object)."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write the object, replacing any previous one, atomically for readers."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> None:
        """Create the object; raise :class:`KeyExists` if the key exists. Atomic."""

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Return the object's size and mtime, or ``None`` if it is absent."""

    @abstractmethod
    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Yield objects whose key starts with ``prefix`` and sorts after ``start_after``,
        in byte-wise key order. Pagination is internal; stop iterating to stop early."""

    @abstractmethod
    def list_level(self, prefix: str) -> tuple[list[str], list[ObjectInfo]]:
        """One level under ``prefix`` (which ends in '/'): the next-level "directories"
        (each ending in '/') and the objects directly at this level, in key order."""

    def list_prefixes(self, prefix: str) -> list[str]:
        return self.list_level(prefix)[0]

    @abstractmethod
    def _delete_batch(self, keys: list[str]) -> DeleteResult:
        """Delete at most :data:`MAX_DELETE_BATCH` keys in one request."""

    def delete_many(self, keys: Iterable[str]) -> DeleteResult:
        """Delete keys in batches of at most 1000. Absent keys count as deleted (S3
        semantics); per-key failures are returned, never swallowed."""
        deleted: list[str] = []
        errors: dict[str, str] = {}
        batch: list[str] = []
        for key in keys:
            batch.append(check_key(key))
            if len(batch) == MAX_DELETE_BATCH:
                res = self._delete_batch(batch)
                deleted.extend(res.deleted)
                errors.update(res.errors)
                batch = []
        if batch:
            res = self._delete_batch(batch)
            deleted.extend(res.deleted)
            errors.update(res.errors)
        return DeleteResult(tuple(deleted), errors)

    def sweep_temporary(self, older_than_s: float, now_s: float | None = None) -> int:
        """Delete what interrupted writes left behind that is older than ``older_than_s``;
        return how many went. A store whose writes leave nothing behind has nothing to do."""
        return 0

    def bulk(self) -> ObjectStore:
        """This store for a caller that paces itself (the GC's lister and deleter): its
        requests fail on the first throttle or transient error, with the error's code,
        instead of being retried underneath, so the caller can back off per prefix
        (:mod:`ctp_state.throttle`). Close it when done if it is not ``self``."""
        return self

    def close(self) -> None:  # pragma: no cover - default no-op
        pass


# --- local filesystem ----------------------------------------------------------------

_TMP_DIR = ".ctp-tmp"


class LocalStore(ObjectStore):
    """A store in a local directory. Atomic create is ``link(2)`` of a fully written,
    fsynced temporary file: it fails with EEXIST if the key exists, and a reader never
    sees a partial object. Works on any POSIX filesystem, including NFS."""

    def __init__(self, root: str, *, fsync: bool = True):
        if not os.path.isabs(root):
            raise ConfigError(f"file store path must be absolute, got {root!r}")
        self.root = os.path.normpath(root)
        self.url = "file://" + self.root
        self._fsync = fsync
        self._tmp = os.path.join(self.root, _TMP_DIR)
        os.makedirs(self._tmp, exist_ok=True)

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    def get(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(key) from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise StoreError(f"invalid range start={start} length={length} for {key!r}")
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read(length)
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
                        raise StoreError(f"writing {key!r}: its temporary file was removed before it was linked "
                                         "(by a temporary-file sweep with a very short age?)") from None
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

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        # Walk the tree lazily. Sorting a directory's children by name, with '/'
        # appended to directory names, yields exactly the byte-wise order of full
        # keys, so the walk matches S3's ListObjectsV2 order without sorting all keys.
        base, _, _ = prefix.rpartition("/")
        start_dir = os.path.join(self.root, *base.split("/")) if base else self.root
        yield from self._walk(start_dir, base + "/" if base else "", prefix, start_after or "")

    def _walk(self, path: str, key_prefix: str, prefix: str, after: str) -> Iterator[ObjectInfo]:
        try:
            with os.scandir(path) as it:
                entries = [(e.name + "/" if e.is_dir(follow_symlinks=False) else e.name, e) for e in it]
        except (FileNotFoundError, NotADirectoryError):
            return
        entries.sort(key=lambda pair: pair[0].encode())
        for sort_name, entry in entries:
            key = key_prefix + sort_name
            if not key_prefix and sort_name == _TMP_DIR + "/":
                continue
            if sort_name.endswith("/"):
                # Every key below starts with `key`; skip subtrees entirely outside
                # the prefix or entirely at/before `after`.
                if not (key.startswith(prefix) or prefix.startswith(key)):
                    continue
                if after and key < after and not after.startswith(key):
                    continue
                yield from self._walk(entry.path, key, prefix, after)
            else:
                if not key.startswith(prefix) or key <= after:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # deleted while listing
                    continue
                yield ObjectInfo(key, st.st_size, st.st_mtime)

    def list_level(self, prefix: str) -> tuple[list[str], list[ObjectInfo]]:
        if prefix and not prefix.endswith("/"):
            raise StoreError(f"list_level needs a prefix ending in '/', got {prefix!r}")
        path = os.path.join(self.root, *prefix.rstrip("/").split("/")) if prefix else self.root
        dirs: list[str] = []
        files: list[ObjectInfo] = []
        try:
            with os.scandir(path) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        if prefix or e.name != _TMP_DIR:
                            dirs.append(prefix + e.name + "/")
                    else:
                        st = e.stat(follow_symlinks=False)
                        files.append(ObjectInfo(prefix + e.name, st.st_size, st.st_mtime))
        except FileNotFoundError:
            return [], []
        return sorted(dirs, key=str.encode), sorted(files, key=lambda o: o.key.encode())

    def _delete_batch(self, keys: list[str]) -> DeleteResult:
        deleted: list[str] = []
        errors: dict[str, str] = {}
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
            self._prune_dirs(os.path.dirname(path))
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


# --- S3 ------------------------------------------------------------------------------


class S3Store(ObjectStore):
    """A store under ``s3://bucket/prefix`` through boto3: AWS S3, MinIO, or any server
    that honours ``If-None-Match: *`` on PUT (all three do)."""

    def __init__(self, bucket: str, prefix: str, client: Any, settings: S3Settings | None = None):
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}"
        self._s3 = client
        self._settings = settings
        from botocore.exceptions import BotoCoreError, ClientError

        # Connection failures (BotoCoreError) become StoreError just like HTTP errors.
        self._ClientError = (ClientError, BotoCoreError)

    def _k(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _code(self, err: Exception) -> str:
        resp = getattr(err, "response", {}) or {}
        return str(resp.get("Error", {}).get("Code", "")) or str(
            resp.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
        )

    def _fail(self, op: str, key: str, err: Exception) -> StoreError:
        code = self._code(err)
        return StoreError(f"S3 {op} of {key!r} in {self.url} failed: {code or err}", code)

    def get(self, key: str) -> bytes:
        try:
            return self._s3.get_object(Bucket=self.bucket, Key=self._k(key))["Body"].read()
        except self._ClientError as e:
            if self._code(e) in ("NoSuchKey", "404", "NotFound"):
                raise ObjectNotFound(key) from None
            raise self._fail("GET", key, e) from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise StoreError(f"invalid range start={start} length={length} for {key!r}")
        if length == 0:
            return b""
        try:
            resp = self._s3.get_object(
                Bucket=self.bucket, Key=self._k(key), Range=f"bytes={start}-{start + length - 1}"
            )
            return resp["Body"].read()
        except self._ClientError as e:
            code = self._code(e)
            if code in ("NoSuchKey", "404", "NotFound"):
                raise ObjectNotFound(key) from None
            if code == "InvalidRange":
                return b""
            raise self._fail("ranged GET", key, e) from None

    def head(self, key: str) -> ObjectInfo | None:
        try:
            r = self._s3.head_object(Bucket=self.bucket, Key=self._k(key))
        except self._ClientError as e:
            if self._code(e) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise self._fail("HEAD", key, e) from None
        return ObjectInfo(key, int(r["ContentLength"]), r["LastModified"].timestamp())

    def put(self, key: str, data: bytes) -> None:
        try:
            self._s3.put_object(Bucket=self.bucket, Key=self._k(key), Body=data)
        except self._ClientError as e:
            raise self._fail("PUT", key, e) from None

    def put_if_absent(self, key: str, data: bytes) -> None:
        try:
            self._s3.put_object(Bucket=self.bucket, Key=self._k(key), Body=data, IfNoneMatch="*")
        except self._ClientError as e:
            # 412: the key exists. 409 ConditionalRequestConflict: a concurrent
            # conditional write to the same key is in flight; it will win or has won.
            if self._code(e) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                raise KeyExists(key) from None
            raise self._fail("conditional PUT", key, e) from None

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}
        if start_after:
            kwargs["StartAfter"] = self.prefix + start_after
        n = len(self.prefix)
        while True:
            try:
                page = self._s3.list_objects_v2(**kwargs)
            except self._ClientError as e:
                raise self._fail("LIST", prefix or "/", e) from None
            for obj in page.get("Contents", ()):
                yield ObjectInfo(obj["Key"][n:], int(obj["Size"]), obj["LastModified"].timestamp())
            if not page.get("IsTruncated"):
                return
            kwargs.pop("StartAfter", None)
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def list_level(self, prefix: str) -> tuple[list[str], list[ObjectInfo]]:
        if prefix and not prefix.endswith("/"):
            raise StoreError(f"list_level needs a prefix ending in '/', got {prefix!r}")
        dirs: list[str] = []
        files: list[ObjectInfo] = []
        n = len(self.prefix)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix, "Delimiter": "/"}
        while True:
            try:
                page = self._s3.list_objects_v2(**kwargs)
            except self._ClientError as e:
                raise self._fail("LIST", prefix or "/", e) from None
            dirs.extend(p["Prefix"][n:] for p in page.get("CommonPrefixes", ()))
            files.extend(ObjectInfo(o["Key"][n:], int(o["Size"]), o["LastModified"].timestamp())
                         for o in page.get("Contents", ()))
            if not page.get("IsTruncated"):
                return dirs, files
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def _delete_batch(self, keys: list[str]) -> DeleteResult:
        assert len(keys) <= MAX_DELETE_BATCH
        try:
            resp = self._s3.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": self._k(k)} for k in keys], "Quiet": True},
            )
        except self._ClientError as e:
            reason = self._code(e) or "request failed"
            return DeleteResult((), {k: reason for k in keys})
        n = len(self.prefix)
        errors = {e["Key"][n:]: e.get("Code", "error") for e in resp.get("Errors", ())}
        return DeleteResult(tuple(k for k in keys if k not in errors), errors)

    def bulk(self) -> ObjectStore:
        if self._settings is None:
            return self
        return S3Store(self.bucket, self.prefix, self._settings.client(max_attempts=1))

    def close(self) -> None:
        self._s3.close()


# --- opening a store by URL ------------------------------------------------------------


@dataclass(frozen=True)
class S3Settings:
    """Where and how to reach S3. Credentials are deliberately not part of ``repr``."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    max_attempts: int = 10
    max_pool_connections: int = 32

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> S3Settings:
        """Read ``CTP_S3_*`` settings, falling back to the standard ``AWS_*`` names."""

        def pick(*names: str) -> str | None:
            for name in names:
                if env.get(name):
                    return env[name]
            return None

        attempts = pick("CTP_S3_MAX_ATTEMPTS") or "10"
        try:
            max_attempts = int(attempts)
        except ValueError:
            raise ConfigError(f"CTP_S3_MAX_ATTEMPTS must be an integer, got {attempts!r}") from None
        if max_attempts < 1:
            raise ConfigError(f"CTP_S3_MAX_ATTEMPTS must be >= 1 (attempts per request, the first included), "
                              f"got {max_attempts}")
        return cls(
            endpoint_url=pick("CTP_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
            region=pick("CTP_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=pick("CTP_S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
            secret_access_key=pick("CTP_S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
            session_token=pick("CTP_S3_SESSION_TOKEN", "AWS_SESSION_TOKEN"),
            max_attempts=max_attempts,
        )

    def client(self, max_attempts: int | None = None) -> Any:
        import boto3
        from botocore.config import Config

        cfg = Config(
            # Standard retries cover 503 SlowDown, 5xx and connection errors with
            # exponential backoff and jitter.
            # total_max_attempts counts the first attempt too (botocore's max_attempts
            # counts only the retries).
            retries={"mode": "standard", "total_max_attempts": max_attempts or self.max_attempts},
            max_pool_connections=self.max_pool_connections,
            s3={"addressing_style": "path"} if self.endpoint_url else None,
        )
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            aws_session_token=self.session_token,
            config=cfg,
        )


def redact_url(url: str) -> str:
    """Drop any ``user:password@`` from a URL so it can be logged."""
    parsed = urlparse(url)
    if parsed.username or parsed.password:
        netloc = parsed.hostname or ""
        if parsed.port:
            netloc += f":{parsed.port}"
        return parsed._replace(netloc=netloc).geturl()
    return url


def open_store(url: str, env: Mapping[str, str] | None = None) -> ObjectStore:
    """Open the store named by ``url``: ``file:///abs/path`` or ``s3://bucket/prefix``.

    S3 endpoint and credentials come from ``env`` (see :meth:`S3Settings.from_env`).
    """
    env = os.environ if env is None else env
    if not url:
        raise ConfigError("no store URL given: pass --store or set CTP_STORE")
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"file store URL must be file:///absolute/path, got {redact_url(url)!r}")
        if not parsed.path.startswith("/"):
            raise ConfigError(f"file store URL must be file:///absolute/path, got {url!r}")
        fsync = env.get("CTP_FSYNC", "1") not in ("0", "false", "no")
        return LocalStore(parsed.path, fsync=fsync)
    if parsed.scheme == "s3":
        if parsed.username or parsed.password:
            raise ConfigError(
                f"credentials in the store URL {redact_url(url)!r} are not allowed; "
                "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an Airflow connection"
            )
        if not parsed.netloc:
            raise ConfigError(f"S3 store URL must be s3://bucket/prefix, got {url!r}")
        settings = S3Settings.from_env(env)
        return S3Store(parsed.netloc, parsed.path, settings.client(), settings)
    raise ConfigError(
        f"unsupported store URL {redact_url(url)!r}: use file:///absolute/path or s3://bucket/prefix"
    )
