"""How to reach a store: S3 settings from a mapping, and URL redaction for logs."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from ctp_state.errors import ConfigError


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
    #: Seconds to wait for a connection, and for the server's next bytes once connected
    #: (not for a whole transfer). With the attempts, they bound how long a server that
    #: accepts and never answers holds a command: 10 x 30 s, not botocore's 10 x 60 s.
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0

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
            raise ConfigError(
                f"CTP_S3_MAX_ATTEMPTS must be >= 1 (attempts per request, the first included), got {max_attempts}"
            )
        endpoint = pick("CTP_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
        if endpoint and not re.match(r"^https?://[^/?#\s]+", endpoint):
            name = next(n for n in ("CTP_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if env.get(n))
            raise ConfigError(f"{name} must be an http(s)://host[:port] URL, got {redact_url(endpoint)!r}")
        if endpoint and url_userinfo(endpoint) is not None:
            name = next(n for n in ("CTP_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if env.get(n))
            raise ConfigError(
                f"credentials in {name} ({redact_url(endpoint)}) are not allowed; "
                "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an Airflow connection"
            )
        connect_timeout_s, read_timeout_s = (
            _seconds(env, "CTP_S3_CONNECT_TIMEOUT_S", cls.connect_timeout_s),
            _seconds(env, "CTP_S3_READ_TIMEOUT_S", cls.read_timeout_s),
        )
        return cls(
            endpoint_url=endpoint,
            region=pick("CTP_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION") or "us-east-1",
            access_key_id=pick("CTP_S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
            secret_access_key=pick("CTP_S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
            session_token=pick("CTP_S3_SESSION_TOKEN", "AWS_SESSION_TOKEN"),
            max_attempts=max_attempts,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
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
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            s3={"addressing_style": "path"} if self.endpoint_url else None,
        )
        from botocore.exceptions import BotoCoreError

        global _session
        # One boto3 session per process: a client from a new session loads the service
        # model again (0.3-0.5 s a client), a second client from the same one takes
        # milliseconds. Credentials are the client's own, never the session's. A
        # session is not safe to make clients from in two threads at once: the lock.
        with _session_lock:
            try:
                if _session is None:
                    _session = boto3.session.Session()
                return _session.client(
                    "s3",
                    endpoint_url=self.endpoint_url,
                    region_name=self.region,
                    aws_access_key_id=self.access_key_id,
                    aws_secret_access_key=self.secret_access_key,
                    aws_session_token=self.session_token,
                    config=cfg,
                )
            except (BotoCoreError, ValueError) as e:  # a bad region or profile (messages name no secret)
                raise ConfigError(
                    f"cannot make an S3 client: {type(e).__name__}: {e} "
                    "(check CTP_S3_REGION / AWS_REGION, AWS_PROFILE and the endpoint)"
                ) from None


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{name} must be a positive number of seconds, got {raw!r}")
    return v


_session: Any = None
_session_lock = threading.Lock()


#: ``scheme://`` and the text up to the first ``@``: the userinfo, if it is one.
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)([^@]*)@")


def url_userinfo(url: str) -> str | None:
    """The ``user:password`` of a URL, however the password is written: a secret key
    may hold ``/``, ``?`` or ``#``, which end the host part for :func:`urlparse` (so it
    finds no password there, and the secret would be printed as a path). Text before the
    first ``@`` is taken for userinfo when :func:`urlparse` finds one or it holds a
    ``:``; a path with ``:`` and ``@`` in it is redacted too (only ever in a message)."""
    m = _USERINFO.match(url)
    if m is None:
        return None
    parsed = urlparse(url)
    if parsed.username or parsed.password or ":" in m.group(2):
        return m.group(2)
    return None


def url_password(url: str) -> str | None:
    """The password in a URL's userinfo (:func:`url_userinfo`), or None."""
    info = url_userinfo(url)
    return info.split(":", 1)[1] if info and ":" in info else None


def redact_url(url: str) -> str:
    """Drop any ``user:password@`` from a URL so it can be logged."""
    m = _USERINFO.match(url)
    if m is None or url_userinfo(url) is None:
        return url
    return m.group(1) + url[m.end() :]
