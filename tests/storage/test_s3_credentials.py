"""Credentials against a real S3 server (SeaweedFS, which checks SigV4 signatures): wrong
or missing ones are refused, ctp says so in one line, and no credential ever shows."""

from __future__ import annotations

import os
import urllib.error
import urllib.request

import pytest

from ctp_state.local_s3 import LocalS3
from tests.support import ctp_on_path as ctp, with_this_checkout


def without_aws(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(("AWS_", "CTP_S3_"))}


def test_the_server_refuses_an_unsigned_request(s3_server: LocalS3):
    """The suite's server enforces authentication: the refusals below are its own."""
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{s3_server.endpoint}/{s3_server.bucket}?list-type=2", timeout=10)
    assert e.value.code == 403 and b"AccessDenied" in e.value.read()


@pytest.mark.parametrize(
    "case, change, code",
    [
        ("wrong secret", {"AWS_SECRET_ACCESS_KEY": "wrong-secret-0123456789abcdef"}, "SignatureDoesNotMatch"),
        ("unknown key", {"AWS_ACCESS_KEY_ID": "ctp-nobody-0123456789"}, "InvalidAccessKeyId"),
        ("no credentials", None, "Unable to locate credentials"),
    ],
)
@pytest.mark.parametrize("command", [["topic", "create", "t", "-p", "1"], ["status"], ["gc", "--dry-run"]])
def test_refused_credentials_are_one_line_that_echoes_no_secret(
    s3_server: LocalS3, tmp_path, case, change, code, command
):
    base = with_this_checkout(without_aws(dict(os.environ)))
    if change is None:
        env = {**base, "CTP_S3_ENDPOINT_URL": s3_server.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
        # nothing for boto3 to find either
        env.update(AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    else:
        env = {**base, **s3_server.env, **change}
    url = s3_server.url("creds")
    r = (
        ctp(env, *command, "--store", url, "--report-dir", str(tmp_path / "report"))
        if command[0] == "gc"
        else ctp(env, *command, "--store", url)
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert code in r.stderr and ("AWS_ACCESS_KEY_ID" in r.stderr), r.stderr  # says what to check
    for value in {s3_server.secret_access_key, s3_server.access_key_id, *(change or {}).values()}:
        assert value not in out
    # nothing was written under the store's prefix
    assert s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=url.split("/", 3)[3]).get("KeyCount") == 0  # type: ignore[attr-defined]


def test_the_local_s3_server_keeps_its_secret_off_its_command_line(s3_server: LocalS3):
    """``ps`` shows a process's arguments to every user: the credentials go through the
    server's environment."""
    assert s3_server.proc is not None
    with open(f"/proc/{s3_server.proc.pid}/cmdline", "rb") as f:
        cmdline = f.read().decode()
    assert "-ip.bind=127.0.0.1" in cmdline
    assert s3_server.secret_access_key not in cmdline and s3_server.access_key_id not in cmdline
