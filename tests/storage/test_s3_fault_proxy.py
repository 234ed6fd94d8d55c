"""The fault-injecting S3 proxy: every fault kind really happens on the wire, seen
through boto3 and through ctp's S3Store, and checked against what moto holds.

``CTP_S3_MAX_ATTEMPTS`` is the number of attempts per request, the first included
(botocore's ``retries.total_max_attempts``; pinned by a test below). The helpers
here take the number of retries: ``retries=0`` is one attempt.
"""

from __future__ import annotations

import socket
import time
import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError

from ctp_state.errors import KeyExists, ObjectNotFound, StoreError
from ctp_state.local_s3 import LocalS3
from ctp_state.storage import ObjectStore, S3Settings, open_store
from tests.support import proxy_env
from tests.support.s3_fault_proxy import S3FaultProxy

PREFIX = "pre"


@pytest.fixture
def bucket(s3_server: LocalS3) -> str:
    return s3_server.new_bucket()


@pytest.fixture(scope="module")
def direct(s3_server: LocalS3) -> Any:
    """A boto3 client straight to the server: the ground truth, bypassing the proxy."""
    return S3Settings.from_env(s3_server.env).client()


def via(env: dict[str, str], bucket: str, retries: int) -> ObjectStore:
    return open_store(f"s3://{bucket}/{PREFIX}", {**env, "CTP_S3_MAX_ATTEMPTS": str(retries + 1)})


def client(env: dict[str, str], retries: int) -> Any:
    return S3Settings.from_env({**env, "CTP_S3_MAX_ATTEMPTS": str(retries + 1)}).client()


def upstream_get(direct: Any, bucket: str, key: str) -> bytes | None:
    try:
        return direct.get_object(Bucket=bucket, Key=f"{PREFIX}/{key}")["Body"].read()
    except direct.exceptions.NoSuchKey:
        return None


def faults(proxy: S3FaultProxy) -> list[str | None]:
    return [e.fault for e in proxy.log]


# --- plain forwarding ----------------------------------------------------------------


def test_store_operations_pass_through_on_one_connection(fault_proxy, fault_env, bucket, direct):
    store = via(fault_env, bucket, retries=0)
    store.put("a/x y+z.bin", b"hello world")
    store.put("a/b", b"b")
    store.put_if_absent("c", b"first")
    with pytest.raises(KeyExists):  # the 412 arrives intact
        store.put_if_absent("c", b"second")
    assert store.get("a/x y+z.bin") == b"hello world"
    assert store.get_range("a/x y+z.bin", 6, 5) == b"world"
    info = store.head("a/x y+z.bin")
    assert info is not None and info.size == 11
    assert store.head("missing") is None  # a bodiless 404 HEAD, then the connection is reused
    with pytest.raises(ObjectNotFound):
        store.get("missing")
    assert [o.key for o in store.list()] == ["a/b", "a/x y+z.bin", "c"]
    assert store.list_level("") == (["a/"], [store.head("c")])
    res = store.delete_many(["a/b", "c"])
    assert sorted(res.deleted) == ["a/b", "c"] and not res.errors

    assert upstream_get(direct, bucket, "c") is None
    assert upstream_get(direct, bucket, "a/x y+z.bin") == b"hello world"
    assert set(faults(fault_proxy)) == {None} and not fault_proxy.injected
    assert fault_proxy.requests == len(fault_proxy.log) == 13
    assert ("PUT", f"{PREFIX}/a/x y+z.bin", None) in fault_proxy.log  # the key is URL-decoded
    assert fault_proxy.connections == 1  # keep-alive held across all of it


def test_aws_chunked_trailer_body_is_forwarded(fault_env, bucket, direct):
    """Over https botocore sends PutObject as ``Transfer-Encoding: chunked`` wrapping an
    ``aws-chunked`` body with a checksum trailer; force that framing over http."""
    s3 = client(fault_env, retries=0)
    seen: dict[str, str] = {}  # what botocore sent, as the proxy received it

    def trailer(context: dict[str, Any], **_: Any) -> None:
        context["checksum"]["request_algorithm"]["in"] = "trailer"

    def capture(request: Any, **_: Any) -> None:
        seen.update((k, v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items())

    s3.meta.events.register("before-call.s3.PutObject", trailer)
    s3.meta.events.register("before-send.s3.PutObject", capture)
    data = bytes(range(256)) * 300
    s3.put_object(Bucket=bucket, Key=f"{PREFIX}/chunked", Body=data)
    assert seen["Transfer-Encoding"] == "chunked" and seen["Content-Encoding"] == "aws-chunked"
    assert upstream_get(direct, bucket, "chunked") == data


def test_unknown_kind_is_one_clear_error(fault_proxy):
    with pytest.raises(ValueError, match=r"^unknown fault kind 'teapot'; expected one of slowdown_503, "):
        fault_proxy.add_rule("teapot")


def test_max_attempts_setting_counts_every_attempt(fault_proxy, fault_env, bucket):
    fault_proxy.add_rule("error_500", method="HEAD")
    for attempts in (1, 2, 3):
        fault_proxy.injected.clear()
        store = open_store(f"s3://{bucket}/{PREFIX}", {**fault_env, "CTP_S3_MAX_ATTEMPTS": str(attempts)})
        with pytest.raises(StoreError, match="500"):
            store.head("k")
        assert fault_proxy.injected["error_500"] == attempts
    assert fault_proxy.requests == 0  # error_500 never reaches the server


# --- faults ---------------------------------------------------------------------------


def test_reset_after_write_persists_but_response_is_lost(fault_proxy, fault_env, bucket, direct):
    fault_proxy.add_rule("reset_after", method="PUT", key_regex=r"/claim$")
    store = via(fault_env, bucket, retries=0)
    with pytest.raises(StoreError):
        store.put_if_absent("claim", b"mine")
    assert upstream_get(direct, bucket, "claim") == b"mine"
    assert list(fault_proxy.log) == [("PUT", f"{PREFIX}/claim", "reset_after")]
    assert fault_proxy.requests == 1


def test_reset_after_then_retry_reports_own_write_as_key_exists(fault_proxy, fault_env, bucket, direct):
    """The retry of a conditional PUT whose response was lost meets its own object: the
    caller is told KeyExists for a write that was in fact its own."""
    fault_proxy.add_rule("reset_after", key_regex=r"/claim$", times=1)
    with pytest.raises(KeyExists):
        via(fault_env, bucket, retries=1).put_if_absent("claim", b"mine")
    assert upstream_get(direct, bucket, "claim") == b"mine"
    assert faults(fault_proxy) == ["reset_after", None] and fault_proxy.requests == 2


def test_error_500_after_write_persists(fault_proxy, fault_env, bucket, direct):
    fault_proxy.add_rule("error_500_after", method="PUT")
    with pytest.raises(StoreError, match="InternalError"):
        via(fault_env, bucket, retries=0).put_if_absent("claim", b"mine")
    assert upstream_get(direct, bucket, "claim") == b"mine"
    s3 = client(fault_env, retries=0)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key=f"{PREFIX}/plain", Body=b"v2")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert upstream_get(direct, bucket, "plain") == b"v2"
    assert fault_proxy.injected["error_500_after"] == 2 and fault_proxy.requests == 2


def test_reset_before_leaves_no_object(fault_proxy, fault_env, bucket, direct):
    fault_proxy.add_rule("reset_before", key_regex=r"/gone$")
    store = via(fault_env, bucket, retries=1)
    with pytest.raises(StoreError):
        store.put_if_absent("gone", b"x")
    assert upstream_get(direct, bucket, "gone") is None
    assert fault_proxy.injected["reset_before"] == 2 and fault_proxy.requests == 0
    store.put("kept", b"y")  # other keys still get through, on a new connection
    assert upstream_get(direct, bucket, "kept") == b"y"


def test_reset_before_is_a_tcp_reset(fault_proxy, bucket):
    fault_proxy.add_rule("reset_before")
    port = int(fault_proxy.endpoint.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET /{bucket}/k HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        with pytest.raises(ConnectionResetError):  # a FIN would read as b"" instead
            s.recv(1024)


def test_slowdown_503_is_retried_until_it_stops(fault_proxy, fault_env, bucket, direct):
    fault_proxy.add_rule("slowdown_503", method="PUT", times=2)
    via(fault_env, bucket, retries=5).put("k", b"v")
    assert upstream_get(direct, bucket, "k") == b"v"
    assert fault_proxy.injected["slowdown_503"] == 2
    assert faults(fault_proxy)[:3] == ["slowdown_503", "slowdown_503", None]
    assert fault_proxy.connections == 1  # the 503s did not cost the connection


def test_a_create_sent_once_is_sent_again_only_after_a_throttle(fault_proxy, fault_env, bucket, direct):
    """put_if_absent_once (the creates of create_once, which checks what it must before
    it re-sends): botocore does not send it again after an answer that may follow the
    write (a 500), only after a throttle, which says the request was not applied."""
    from ctp_state.errors import StoreError

    store = via(fault_env, bucket, retries=5)
    fault_proxy.add_rule("error_500", method="PUT", times=1)
    with pytest.raises(StoreError):
        store.put_if_absent_once("a", b"v")
    assert faults(fault_proxy) == ["error_500"]  # sent once
    fault_proxy.add_rule("slowdown_503", method="PUT", times=2)
    store.put_if_absent_once("b", b"v")
    assert upstream_get(direct, bucket, "b") == b"v"
    assert faults(fault_proxy)[-3:] == ["slowdown_503", "slowdown_503", None]
    store.put_if_absent("c", b"v")  # the plain create keeps botocore's retries
    fault_proxy.add_rule("error_500", method="PUT", times=1)
    store.put_if_absent("d", b"v")
    assert upstream_get(direct, bucket, "d") == b"v"


def test_slowdown_503_surfaces_to_boto3(fault_proxy, fault_env, bucket, direct):
    fault_proxy.add_rule("slowdown_503")
    with pytest.raises(ClientError) as e:
        client(fault_env, retries=0).put_object(Bucket=bucket, Key=f"{PREFIX}/k", Body=b"v")
    assert e.value.response["Error"]["Code"] == "SlowDown"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert upstream_get(direct, bucket, "k") is None and fault_proxy.requests == 0


def test_error_500_and_rule_filters(fault_proxy, fault_env, bucket, direct):
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/a", Body=b"a")
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/b", Body=b"b")
    fault_proxy.add_rule("error_500", method="GET", key_regex=r"/a$")
    s3 = client(fault_env, retries=0)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key=f"{PREFIX}/a")
    assert e.value.response["Error"]["Code"] == "InternalError"
    assert s3.get_object(Bucket=bucket, Key=f"{PREFIX}/b")["Body"].read() == b"b"  # other key
    assert s3.head_object(Bucket=bucket, Key=f"{PREFIX}/a")["ContentLength"] == 1  # other method
    fault_proxy.clear_rules()
    assert s3.get_object(Bucket=bucket, Key=f"{PREFIX}/a")["Body"].read() == b"a"
    assert faults(fault_proxy) == ["error_500", None, None, None]


def test_delete_key_errors_keeps_withheld_keys(fault_proxy, fault_env, bucket, direct):
    store = via(fault_env, bucket, retries=0)
    for k in ("d/1", "d/2", "d/3"):
        store.put(k, b"x")
    fault_proxy.add_rule("delete_key_errors", key_regex=r"/d/2$")
    res = store.delete_many(["d/1", "d/2", "d/3"])  # Quiet mode
    assert res.errors == {"d/2": "InternalError"} and sorted(res.deleted) == ["d/1", "d/3"]
    assert [upstream_get(direct, bucket, k) for k in ("d/1", "d/2", "d/3")] == [None, b"x", None]
    assert ("POST", f"{PREFIX}/d/2", "delete_key_errors") in fault_proxy.log


def test_delete_key_errors_on_every_key_verbose(fault_proxy, fault_env, bucket, direct):
    for k in ("e/1", "e/2"):
        direct.put_object(Bucket=bucket, Key=f"{PREFIX}/{k}", Body=b"x")
    fault_proxy.add_rule("delete_key_errors")
    resp = client(fault_env, retries=0).delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": f"{PREFIX}/e/1"}, {"Key": f"{PREFIX}/e/2"}]}
    )
    assert sorted(e["Key"] for e in resp["Errors"]) == [f"{PREFIX}/e/1", f"{PREFIX}/e/2"]
    assert not resp.get("Deleted")
    assert upstream_get(direct, bucket, "e/1") == upstream_get(direct, bucket, "e/2") == b"x"
    assert fault_proxy.requests == 0  # nothing left to forward


def test_slow_delays_then_forwards(fault_proxy, fault_env, bucket, direct):
    fault_proxy.add_rule("slow", method="PUT", delay_s=0.6)
    store = via(fault_env, bucket, retries=0)
    t0 = time.monotonic()
    store.put("k", b"v")
    assert time.monotonic() - t0 >= 0.6
    assert upstream_get(direct, bucket, "k") == b"v"
    assert fault_proxy.injected["slow"] == 1 and fault_proxy.requests == 1


def test_probability_is_seeded_and_reproducible(s3_server, bucket):
    def run(seed: int) -> list[bool]:
        """Which of 40 HEADs failed, as the client saw it (and as the proxy logged it)."""
        with S3FaultProxy.for_server(s3_server, seed=seed) as proxy:
            proxy.add_rule("error_500", method="HEAD", probability=0.5)
            s3 = client(proxy_env(s3_server, proxy), retries=0)
            failed = []
            for _ in range(40):
                try:
                    s3.head_object(Bucket=bucket, Key=f"{PREFIX}/{uuid.uuid4().hex}")
                except ClientError as e:
                    failed.append(e.response["ResponseMetadata"]["HTTPStatusCode"] == 500)
            assert failed == [f == "error_500" for f in faults(proxy)]
            return failed

    first = run(7)
    assert 0 < sum(first) < 40
    assert run(7) == first
    assert run(8) != first
