"""The S3 backend: ``s3://bucket/prefix`` through boto3 (AWS S3, MinIO, moto).

412/409 on a conditional write become one :class:`KeyExists`, once.
"""

from __future__ import annotations

import builtins
import random
import re
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import ParseResult

from ctp_state.errors import ConfigError, KeyExists, ObjectNotFound, StoreError
from ctp_state.storage.base import MAX_DELETE_BATCH, DeleteResult, ObjectInfo, ObjectStore, check_key
from ctp_state.storage.settings import S3Settings, redact_url, url_userinfo
from ctp_state.throttle import is_throttle

#: What a server answers to a request signed with a wrong or unknown key.
_REFUSED_CREDENTIALS = frozenset(
    {"SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied", "ExpiredToken", "InvalidToken", "403"}
)


class S3Store(ObjectStore):
    """A store under ``s3://bucket/prefix`` through boto3: AWS S3, MinIO, or any server
    that honours ``If-None-Match: *`` on PUT (all three do)."""

    def __init__(self, bucket: str, prefix: str, client: Any, settings: S3Settings | None = None):
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}"
        self._s3 = client
        self._settings = settings
        self._creates: Any = None  # the client of put_if_absent_once
        self._creates_lock = threading.Lock()
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
        hint = ""
        if code in _REFUSED_CREDENTIALS:
            hint = " (the server refused the credentials: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or the Airflow connection)"
        elif type(err).__name__ == "NoCredentialsError":
            hint = " (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or an Airflow connection)"
        # Neither the code nor botocore's messages carry a credential.
        return StoreError(f"S3 {op} of {key!r} in {self.url} failed: {code or err}{hint}", code)

    def get(self, key: str) -> bytes:
        try:
            data: bytes = self._s3.get_object(Bucket=self.bucket, Key=self._k(key))["Body"].read()
            return data
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
            data: bytes = resp["Body"].read()
            return data
        except self._ClientError as e:
            code = self._code(e)
            if code in ("NoSuchKey", "404", "NotFound"):
                raise ObjectNotFound(key) from None
            if code == "InvalidRange":
                return b""
            raise self._fail("ranged GET", key, e) from None

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        if length <= 0:
            raise StoreError(f"invalid tail length {length} for {key!r}")
        try:  # a suffix range: the object's size comes back in Content-Range
            resp = self._s3.get_object(Bucket=self.bucket, Key=self._k(key), Range=f"bytes=-{length}")
            data: bytes = resp["Body"].read()
        except self._ClientError as e:
            code = self._code(e)
            if code in ("NoSuchKey", "404", "NotFound"):
                raise ObjectNotFound(key) from None
            if code == "InvalidRange":  # an empty object has no last bytes
                return super().get_tail(key, length)
            raise self._fail("ranged GET", key, e) from None
        total = (resp.get("ContentRange") or "").rpartition("/")[2]
        if not total.isdigit():  # the whole object came back (a server that ignored the range)
            return data[-length:], len(data)
        return data, int(total)

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
        self._create(self._s3, key, data)

    def put_if_absent_once(self, key: str, data: bytes) -> None:
        # A client with botocore's retries off, made on first use: its retries would send
        # the create again unseen, and a log entry is sent again only after its writer
        # checked the entry before it (ctp_state.sequence.create_once is the retry loop).
        # A throttle (503 SlowDown) is the one answer that says the request was not
        # applied: that alone is sent again here, with backoff, as botocore would.
        if self._settings is None:
            return self._create(self._s3, key, data)
        with self._creates_lock:
            if self._creates is None:
                self._creates = self._settings.client(max_attempts=1)
        for attempt in range(self._settings.max_attempts):
            try:
                return self._create(self._creates, key, data)
            except StoreError as e:
                if not is_throttle(e.code) or attempt + 1 >= self._settings.max_attempts:
                    raise
            time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random() / 2))

    def _create(self, client: Any, key: str, data: bytes) -> None:
        try:
            client.put_object(Bucket=self.bucket, Key=self._k(key), Body=data, IfNoneMatch="*")
        except self._ClientError as e:
            # 412: the key exists. 409 ConditionalRequestConflict: a concurrent
            # conditional write to the same key is in flight; it will win or has won.
            if self._code(e) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                raise KeyExists(key) from None
            raise self._fail("conditional PUT", key, e) from None

    def _listed(self, prefix: str, start_after: str | None) -> Iterator[dict[str, Any]]:
        """The objects ListObjectsV2 answers, page after page, in the server's order,
        but folder markers (see :func:`_folder`)."""
        kwargs: dict[str, str] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}  # list_objects_v2's
        if start_after:
            kwargs["StartAfter"] = self.prefix + start_after
        while True:
            try:
                page = self._s3.list_objects_v2(**kwargs)
            except self._ClientError as e:
                raise self._fail("LIST", prefix or "/", e) from None
            yield from (o for o in page.get("Contents", ()) if not _folder(o))
            if not page.get("IsTruncated"):
                return
            kwargs.pop("StartAfter", None)
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def list(
        self, prefix: str = "", start_after: str | None = None, end_before: str | None = None
    ) -> Iterator[ObjectInfo]:
        n = len(self.prefix)
        previous = (self.prefix + start_after).encode() if start_after else b""
        for obj in self._listed(prefix, start_after):
            raw = obj["Key"].encode()
            if raw <= previous:
                raise self._out_of_order(obj["Key"][n:], previous.decode()[n:])
            previous = raw
            key = obj["Key"][n:]
            if end_before is not None and key >= end_before:
                return  # S3 has no end bound: the first page past it is the last request
            yield ObjectInfo(key, int(obj["Size"]), obj["LastModified"].timestamp())

    def list_all(self, prefix: str) -> builtins.list[ObjectInfo]:
        n = len(self.prefix)
        seen = {
            obj["Key"]: ObjectInfo(obj["Key"][n:], int(obj["Size"]), obj["LastModified"].timestamp())
            for obj in self._listed(prefix, None)
        }
        return sorted(seen.values(), key=lambda o: o.key.encode())

    def list_level(self, prefix: str) -> tuple[builtins.list[str], builtins.list[ObjectInfo]]:
        if prefix and not prefix.endswith("/"):
            raise StoreError(f"list_level needs a prefix ending in '/', got {prefix!r}")
        dirs: builtins.list[str] = []
        files: builtins.list[ObjectInfo] = []
        n = len(self.prefix)
        kwargs: dict[str, str] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix, "Delimiter": "/"}
        while True:
            try:
                page = self._s3.list_objects_v2(**kwargs)
            except self._ClientError as e:
                raise self._fail("LIST", prefix or "/", e) from None
            dirs.extend(p["Prefix"][n:] for p in page.get("CommonPrefixes", ()))
            files.extend(
                ObjectInfo(o["Key"][n:], int(o["Size"]), o["LastModified"].timestamp())
                for o in page.get("Contents", ())
                if not _folder(o)
            )
            if not page.get("IsTruncated"):
                # Some servers (SeaweedFS) order one level by name without the trailing
                # '/', so 'a/' before 'a-b/'; a level is in memory anyway: sort it here.
                dirs.sort(key=str.encode)
                files.sort(key=lambda o: o.key.encode())
                return dirs, files
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def _out_of_order(self, key: str, after: str) -> StoreError:
        """ctp streams only ranges whose names are of one width at every level, where
        byte order and a directory walk (SeaweedFS lists 'a/x' before 'a-b/x') agree; a
        range that crosses a name level goes through :meth:`list_all`. A listing out of
        order here means a key that is not ctp's beside one that is: a bounded listing
        could stop before it, so never follow it silently."""
        return StoreError(
            f"the S3 server of {self.url} listed {key!r} after {after!r}, out of byte order, in a "
            "listing ctp bounds by key: a key that ctp did not write sits beside its own (look at "
            "both; a server that lists directory by directory orders names that differ by '-' or '.' "
            "before '/' this way)",
            "ListOrder",
        )

    def _delete_batch(self, keys: builtins.list[str]) -> DeleteResult:
        assert len(keys) <= MAX_DELETE_BATCH
        try:
            resp = self._s3.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": self._k(k)} for k in keys], "Quiet": True},
            )
        except self._ClientError as e:
            reason = self._code(e) or "request failed"
            return DeleteResult((), dict.fromkeys(keys, reason))
        n = len(self.prefix)
        errors = {e["Key"][n:]: e.get("Code", "error") for e in resp.get("Errors", ())}
        return DeleteResult(tuple(k for k in keys if k not in errors), errors)

    def bulk(self) -> ObjectStore:
        if self._settings is None:
            return self
        return S3Store(self.bucket, self.prefix, self._settings.client(max_attempts=1))

    def close(self) -> None:
        self._s3.close()
        if self._creates is not None:
            self._creates.close()


def _folder(obj: dict[str, Any]) -> bool:
    """A folder marker: an empty object whose key ends in '/'. S3 consoles make them, and
    SeaweedFS answers a listing of a folder it is removing (its last object deleted)
    with the folder itself as one. ctp never writes such a key (every key it writes
    ends in a file name), so a marker is nothing of ctp's: not an object, not a stray."""
    return int(obj.get("Size", 0)) == 0 and str(obj.get("Key", "")).endswith("/")


def open_s3(parsed: ParseResult, url: str, env: Mapping[str, str], create: bool = True) -> S3Store:
    """The opener the registry calls for ``s3://`` URLs; endpoint and credentials come
    from ``env`` (:meth:`S3Settings.from_env`), never from the URL. ``create`` changes
    nothing: ctp never creates a bucket, and a missing one fails on the first request."""
    if url_userinfo(url) is not None:
        raise ConfigError(
            f"credentials in the store URL {redact_url(url)!r} are not allowed; "
            "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an Airflow connection"
        )
    if not parsed.netloc:
        raise ConfigError(f"S3 store URL must be s3://bucket/prefix, got {url!r}")
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,255}", parsed.netloc):
        raise ConfigError(
            f"S3 store URL {url!r}: {parsed.netloc!r} is not a bucket name (letters, digits, '.', '-', '_')"
        )
    settings = S3Settings.from_env(env)
    return S3Store(parsed.netloc, parsed.path, settings.client(), settings)
