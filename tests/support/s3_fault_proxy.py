"""A fault-injecting S3 reverse proxy for tests, between boto3 and an S3 server on loopback
(SeaweedFS, or moto's emulator).

Faults are injected at the network level (a real 503 on the wire, a real TCP reset, a
write that reaches the server whose response is lost), so the code under test meets
them through botocore's own retry and error paths rather than through mocks.

Only path-style requests are understood (``/<bucket>/<key>``), which is what
:class:`ctp_state.storage.S3Settings` configures whenever an endpoint URL is set.

What botocore 1.44 sends (measured against moto over ``http://``): ``put_object`` with
a bytes body goes with ``Content-Length``, ``Expect: 100-continue`` and the checksum in
an ``x-amz-checksum-crc32`` header; ``delete_objects`` likewise with a
``Content-Length`` XML body and ``x-amz-checksum-crc32`` (no ``Content-MD5``). Over
``https://`` botocore moves the checksum of a streaming upload into a trailer:
``Transfer-Encoding: chunked`` wrapping a ``Content-Encoding: aws-chunked`` body. The
proxy forwards a chunked body byte for byte, so both framings reach the server unchanged.

A request the proxy rewrites (a DeleteObjects body with keys withheld) is signed again
with the server's credentials when the proxy has them (:meth:`S3FaultProxy.for_server`):
a real server checks SigV4 signatures, which cover the body's hash.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import http.client
import random
import re
import socket
import struct
import threading
import time
import uuid
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

KINDS = (
    "slowdown_503",
    "error_500",
    "reset_before",
    "reset_after",
    "error_500_after",
    "slow",
    "delete_key_errors",
)

#: Hop-by-hop headers: they describe one connection, not the request, so the proxy
#: drops them in both directions. ``Expect`` is answered by the proxy itself (the body
#: is already read when the request goes upstream).
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "expect"})
_S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"


class LogEntry(NamedTuple):
    method: str
    key: str | None  # object key; for DeleteObjects the key a firing rule matched
    fault: str | None


@dataclass
class FaultRule:
    """One fault: which requests it matches and how often it fires."""

    kind: str
    method: str | None = None
    key_regex: re.Pattern[str] | None = None
    times: int | None = None
    probability: float | None = None
    delay_s: float = 0.0
    fired: int = field(default=0, init=False)

    def match(self, method: str, keys: list[str], is_delete: bool) -> tuple[bool, str | None]:
        """Whether the request is this rule's (ignoring times/probability), and the key
        that matched. ``delete_key_errors`` only applies to DeleteObjects."""
        if self.kind == "delete_key_errors" and not is_delete:
            return False, None
        if self.method is not None and self.method != method:
            return False, None
        if self.key_regex is None:
            return True, keys[0] if len(keys) == 1 else None
        hit = next((k for k in keys if self.key_regex.search(k)), None)
        return hit is not None, hit


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: S3FaultProxy

    def process_request(self, request, client_address):  # type: ignore[no-untyped-def]
        with self.proxy._lock:
            self.proxy._conns.add(request)
            self.proxy.connections += 1
        super().process_request(request, client_address)

    def handle_error(self, request, client_address):  # type: ignore[no-untyped-def]
        """A client that went away (killed mid-request, or reset by a fault) is no error
        of the proxy's: no traceback on stderr. Anything else is printed as usual."""
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    def shutdown_request(self, request):  # type: ignore[no-untyped-def]
        with self.proxy._lock:
            self.proxy._conns.discard(request)
        super().shutdown_request(request)


class S3FaultProxy:
    """HTTP/1.1 reverse proxy on ``127.0.0.1`` in front of a loopback S3 endpoint.

    Rules are tried in the order added; the first that matches and fires decides the
    request's fault. ``injected`` counts fired faults by kind, ``requests`` counts
    requests sent upstream, ``log`` keeps the last requests as :class:`LogEntry`, and
    ``connections`` counts client connections accepted (keep-alive keeps it low).
    """

    def __init__(
        self,
        upstream_endpoint: str,
        seed: int = 0,
        log_size: int = 1000,
        credentials: tuple[str, str] | None = None,
        region: str = "us-east-1",
    ):
        up = urlsplit(upstream_endpoint)
        self.credentials = credentials
        self.region = region
        if up.scheme != "http" or up.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"upstream must be an http:// loopback endpoint, got {upstream_endpoint!r}")
        self.upstream = (up.hostname, up.port or 80)
        self.injected: collections.Counter[str] = collections.Counter()
        self.requests = 0
        self.connections = 0
        self.log: collections.deque[LogEntry] = collections.deque(maxlen=log_size)
        self._rules: list[FaultRule] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def for_server(cls, server: object, seed: int = 0) -> S3FaultProxy:
        """A proxy in front of a test server (anything with ``endpoint`` and ``env``),
        holding its credentials to sign rewritten requests again."""
        env: dict[str, str] = server.env  # type: ignore[attr-defined]
        creds = (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
        return cls(server.endpoint, seed=seed, credentials=creds)  # type: ignore[attr-defined]

    # --- lifecycle ---------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> S3FaultProxy:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.proxy = self
        self._server = server
        # A short poll interval: stop() waits up to one interval for serve_forever to notice.
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="s3-fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and cut idle keep-alive connections, so no handler outlives the test."""
        if self._server is None:
            return
        self._server.shutdown()
        with self._lock:
            conns = list(self._conns)
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()
        assert self._thread is not None
        self._thread.join(10)
        self._server = None

    def __enter__(self) -> S3FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- rules -------------------------------------------------------------------

    def add_rule(
        self,
        kind: str,
        *,
        method: str | None = None,
        key_regex: str | None = None,
        times: int | None = None,
        probability: float | None = None,
        delay_s: float = 0.0,
    ) -> FaultRule:
        """Add a fault. ``key_regex`` is searched in the URL-decoded key (any key of a
        DeleteObjects body); ``delay_s`` is slept before the fault acts, whatever its kind."""
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {', '.join(KINDS)}")
        if times is not None and times < 0:
            raise ValueError(f"times must be >= 0 or None, got {times}")
        if probability is not None and not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability must be within [0, 1], got {probability}")
        if kind == "slow" and delay_s <= 0:
            raise ValueError("a 'slow' rule needs delay_s > 0")
        rule = FaultRule(
            kind,
            method.upper() if method else None,
            re.compile(key_regex) if key_regex is not None else None,
            times,
            probability,
            delay_s,
        )
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear_rules(self, keep: Callable[[FaultRule], bool] = lambda rule: False) -> None:
        """Drop every rule (but those ``keep`` is true for)."""
        with self._lock:
            self._rules[:] = [r for r in self._rules if keep(r)]

    def _pick(self, method: str, keys: list[str], is_delete: bool) -> tuple[FaultRule | None, str | None]:
        """The rule that fires for this request, counted and logged. The seeded RNG is
        drawn only for rules that match and are not used up, so a given sequence of
        requests sees the same faults on every run."""
        with self._lock:
            for rule in self._rules:
                ok, key = rule.match(method, keys, is_delete)
                if not ok or (rule.times is not None and rule.fired >= rule.times):
                    continue
                if rule.probability is not None and self._rng.random() >= rule.probability:
                    continue
                rule.fired += 1
                self.injected[rule.kind] += 1
                self.log.append(LogEntry(method, key, rule.kind))
                return rule, key
            self.log.append(LogEntry(method, keys[0] if len(keys) == 1 and not is_delete else None, None))
            return None, None


def _error_xml(code: str, message: str) -> bytes:
    rid = uuid.uuid4().hex[:16].upper()
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{escape(message)}</Message><RequestId>{rid}</RequestId>"
        f"<HostId>s3-fault-proxy</HostId></Error>"
    ).encode()


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def _rewritten_headers(headers: list[tuple[str, str]], body: bytes) -> list[tuple[str, str]]:
    """Headers for a rewritten body: length and every digest recomputed, digests the
    stdlib cannot compute (CRC32C, CRC64NVME) dropped with their algorithm header.
    moto 5 checks none of them, real S3 checks all. The SigV4 signature (which covers
    ``x-amz-content-sha256``) is left stale here: :func:`_resigned` renews it."""
    digests = {
        "content-md5": lambda: _b64(hashlib.md5(body).digest()),
        "x-amz-checksum-crc32": lambda: _b64(struct.pack(">I", zlib.crc32(body))),
        "x-amz-checksum-sha1": lambda: _b64(hashlib.sha1(body).digest()),
        "x-amz-checksum-sha256": lambda: _b64(hashlib.sha256(body).digest()),
    }
    droppable = {"x-amz-checksum-crc32c", "x-amz-checksum-crc64nvme"}
    dropped = any(k.lower() in droppable for k, _ in headers)
    out: list[tuple[str, str]] = []
    for k, v in headers:
        lk = k.lower()
        if lk in ("content-length", "transfer-encoding") or lk in droppable:
            continue
        if dropped and lk == "x-amz-sdk-checksum-algorithm":
            continue
        if lk in digests:
            v = digests[lk]()
        elif lk == "x-amz-content-sha256" and re.fullmatch(r"[0-9a-f]{64}", v):
            v = hashlib.sha256(body).hexdigest()
        out.append((k, v))
    out.append(("Content-Length", str(len(body))))
    return out


def _resigned(
    headers: list[tuple[str, str]], method: str, path: str, body: bytes, credentials: tuple[str, str], region: str
) -> list[tuple[str, str]]:
    """``headers`` with a fresh SigV4 signature over ``body`` (botocore's own signer)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    host = next(v for k, v in headers if k.lower() == "host")
    stale = {"authorization", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token"}
    req = AWSRequest(
        method=method,
        url=f"http://{host}{path}",
        data=body,
        headers={k: v for k, v in headers if k.lower() not in stale},
    )
    S3SigV4Auth(Credentials(*credentials), "s3", region).add_auth(req)
    return list(req.headers.items())


def _parse_delete(body: bytes) -> tuple[list[tuple[str, str | None]], bool]:
    """``([(key, version_id)], quiet)`` of a DeleteObjects body, namespace-agnostic."""
    root = ET.fromstring(body)
    objs: list[tuple[str, str | None]] = []
    quiet = False
    for el in root:
        tag = el.tag.rsplit("}", 1)[-1]
        if tag == "Object":
            fields = {c.tag.rsplit("}", 1)[-1]: c.text or "" for c in el}
            objs.append((fields.get("Key", ""), fields.get("VersionId")))
        elif tag == "Quiet":
            quiet = (el.text or "").strip().lower() == "true"
    return objs, quiet


def _delete_xml(objs: list[tuple[str, str | None]], quiet: bool) -> bytes:
    parts = [f'<Delete xmlns="{_S3_NS}">']
    for key, version in objs:
        vid = f"<VersionId>{escape(version)}</VersionId>" if version else ""
        parts.append(f"<Object><Key>{escape(key)}</Key>{vid}</Object>")
    if quiet:
        parts.append("<Quiet>true</Quiet>")
    parts.append("</Delete>")
    return "".join(parts).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive to the client
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    @property
    def proxy(self) -> S3FaultProxy:
        return self.server.proxy

    def _read_body(self) -> tuple[bytes, bytes]:
        """``(decoded, raw)``: a chunked body is kept raw (chunk framing and trailers
        included) so it can go upstream exactly as the client framed it."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raw, data = bytearray(), bytearray()
            while True:
                line = self.rfile.readline(65537)
                raw += line
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while True:  # trailer section, up to the empty line
                        line = self.rfile.readline(65537)
                        raw += line
                        if line in (b"\r\n", b"\n", b""):
                            return bytes(data), bytes(raw)
                chunk = self.rfile.read(size)
                raw += chunk + self.rfile.read(2)
                data += chunk
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        return body, body

    def _handle(self) -> None:
        method = self.command
        body, raw = self._read_body()
        url = urlsplit(self.path)
        _bucket, _, key = url.path.lstrip("/").partition("/")
        is_delete = method == "POST" and not key and "delete" in parse_qs(url.query, keep_blank_values=True)
        objs: list[tuple[str, str | None]] = []
        quiet = False
        if is_delete:
            try:
                objs, quiet = _parse_delete(body)
            except ET.ParseError:
                is_delete = False
        keys = [k for k, _ in objs] if is_delete else ([unquote(key)] if key else [])
        rule, _ = self.proxy._pick(method, keys, is_delete)
        kind = rule.kind if rule else None
        if rule is not None and rule.delay_s > 0:
            time.sleep(rule.delay_s)
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP]

        if kind == "slowdown_503":
            return self._send_error(503, "SlowDown", "Please reduce your request rate.")
        if kind == "error_500":
            return self._send_error(500, "InternalError", "We encountered an internal error. Please try again.")
        if kind == "reset_before":
            return self._reset()
        if kind == "delete_key_errors":
            assert rule is not None
            return self._delete_with_errors(rule, headers, objs, quiet)
        resp = self._forward(method, headers, raw)
        if resp is None:
            return
        if kind == "reset_after":
            return self._reset()
        if kind == "error_500_after":
            return self._send_error(500, "InternalError", "We encountered an internal error. Please try again.")
        self._relay(*resp)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    def _forward(
        self, method: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes] | None:
        """Send the request upstream on a fresh connection (moto closes each one) and
        read the whole response; on failure answer 502 and return None."""
        conn = http.client.HTTPConnection(*self.upstream_addr, timeout=60)
        try:
            has_host = any(k.lower() == "host" for k, _ in headers)
            conn.putrequest(method, self.path, skip_host=has_host, skip_accept_encoding=True)
            for k, v in headers:
                conn.putheader(k, v)
            conn.endheaders(body or None)
            with self.proxy._lock:
                self.proxy.requests += 1
            r = conn.getresponse()
            payload = r.read()
            return r.status, r.reason, r.getheaders(), payload
        except (OSError, http.client.HTTPException) as e:
            self._send_error(502, "BadGateway", f"upstream failed: {e}")
            return None
        finally:
            conn.close()

    @property
    def upstream_addr(self) -> tuple[str, int]:
        host, port = self.proxy.upstream
        return str(host), port

    def _relay(self, status: int, reason: str, headers: list[tuple[str, str]], payload: bytes) -> None:
        """Send a response; a HEAD's (or 204/304's) Content-Length is the upstream's,
        any other is the length of the body actually sent."""
        bodyless = self.command == "HEAD" or status in (204, 304) or 100 <= status < 200
        self.send_response_only(status, reason)
        for k, v in headers:
            lk = k.lower()
            if lk in _HOP or lk == "transfer-encoding" or (lk == "content-length" and not bodyless):
                continue
            self.send_header(k, v)
        if not bodyless:
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if not bodyless and payload:
            self.wfile.write(payload)

    def _send_error(self, status: int, code: str, message: str) -> None:
        body = _error_xml(code, message)
        hdrs = [("Content-Type", "application/xml"), ("x-amz-request-id", uuid.uuid4().hex[:16].upper())]
        if self.command == "HEAD":  # no body on HEAD, or the next response is corrupted
            hdrs.append(("Content-Length", "0"))
        reason = http.client.responses.get(status, "")
        self._relay(status, reason, hdrs, body)

    def _reset(self) -> None:
        """Abort the client connection with a TCP RST (SO_LINGER 0, no FIN first)."""
        self.close_connection = True
        sock = self.connection
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()  # drop the makefile() reference so close() really closes
        sock.close()

    def _delete_with_errors(
        self, rule: FaultRule, headers: list[tuple[str, str]], objs: list[tuple[str, str | None]], quiet: bool
    ) -> None:
        """Withhold the keys ``rule`` matches, forward the rest, report the withheld as
        per-key InternalError entries (S3 reports errors in Quiet mode too)."""
        withheld = [o for o in objs if rule.key_regex is None or rule.key_regex.search(o[0])]
        kept = [o for o in objs if o not in withheld]
        if kept:  # servers answer MalformedXML to an empty <Delete>: don't send one
            new_body = _delete_xml(kept, quiet)
            new_headers = _rewritten_headers(headers, new_body)
            if self.proxy.credentials is not None:
                new_headers = _resigned(
                    new_headers, "POST", self.path, new_body, self.proxy.credentials, self.proxy.region
                )
            resp = self._forward("POST", new_headers, new_body)
            if resp is None:
                return
            if resp[0] != 200:
                return self._relay(*resp)
            status, reason, rheaders, payload = resp
        else:
            status, reason = 200, "OK"
            rheaders = [("Content-Type", "application/xml")]
            payload = f'<?xml version="1.0" encoding="UTF-8"?>\n<DeleteResult xmlns="{_S3_NS}"/>'.encode()
        errors = "".join(
            f"<Error><Key>{escape(k)}</Key><Code>InternalError</Code>"
            "<Message>We encountered an internal error. Please try again.</Message></Error>"
            for k, _ in withheld
        ).encode()
        payload, n = re.subn(rb"</DeleteResult>\s*$", lambda m: errors + b"</DeleteResult>", payload)
        if not n:
            payload = re.sub(
                rb"<DeleteResult([^>]*)/>",
                lambda m: b"<DeleteResult" + m.group(1) + b">" + errors + b"</DeleteResult>",
                payload,
            )
        self._relay(status, reason, rheaders, payload)
