"""The ``ctp`` command as a user runs it: a real process, on both store backends."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ctp_state import layout
from tests.support import REPO, ctp, ok, with_this_checkout


def test_a_new_users_session(subprocess_env, store):
    env = subprocess_env
    assert "created topic orders with 3 partitions" in ok(env, "topic", "create", "orders", "--partitions", "3")
    listed = json.loads(ok(env, "topic", "list", "--json"))
    assert listed == [
        {
            "topic": "orders",
            "partitions": 3,
            "created_ms": listed[0]["created_ms"],
            "id": listed[0]["id"],
            "state": "live",
        }
    ]
    assert len(listed[0]["id"]) == 32  # the topic's incarnation
    assert json.loads(ok(env, "epoch", "show", "--json")) == {"epoch": 1}
    assert ok(env, "epoch", "advance").strip() == "2"
    summary = json.loads(
        ok(
            env,
            "produce",
            "--generate",
            "--topic",
            "orders",
            "--records",
            "3000",
            "--batch-records",
            "1000",
            "--value-size",
            "64",
            "--json",
        )
    )
    assert summary["accepted"] == 3000 and summary["rejected"] == 0
    status = json.loads(ok(env, "status", "--json"))
    assert status["cluster_epoch"] == 2
    parts = status["partitions"]
    assert [p["partition"] for p in parts] == [0, 1, 2]
    assert sum(p["next_offset"] for p in parts) == 3000
    for p in parts:
        assert p["window"] == [2, 2] or p["window"] == [1, 2]
        assert p["max_applied_epoch"] == 2 and p["previous_applied_epoch"] == 1
        assert p["min_epoch_lower_bound"] == 1 and p["m"] == 0
        assert p["lag_entries"] == 3 and p["lag_records"] == 1000 and p["lag_bytes"] > 64_000
    table = ok(env, "status")
    assert "orders" in table and "cluster epoch 2" in table
    assert len(list(store.list(layout.L0_ROOT))) == 3  # one L0 object per flush


def test_produce_from_a_jsonl_file(subprocess_env, tmp_path):
    env = subprocess_env
    ok(env, "topic", "create", "t", "-p", "2")
    path = tmp_path / "in.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                {"topic": "t", "partition": 0, "key": "a", "value": "one"},
                {"topic": "t", "partition": 1, "value_b64": "AAEC", "headers": {"h": "v"}},
                {"topic": "t", "partition": 0, "value": "two", "timestamp": 1700000000000},
            ]
        )
        + "\n"
    )
    out = json.loads(ok(env, "produce", str(path), "--json"))
    assert out["accepted"] == 3
    status = {p["partition"]: p for p in json.loads(ok(env, "status", "--json", "--topic", "t"))["partitions"]}
    assert status[0]["next_offset"] == 2 and status[1]["next_offset"] == 1
    # stdin works too
    out = json.loads(ok(env, "produce", "-", "--json", input='{"topic":"t","partition":1,"value":"x"}\n'))
    assert out["accepted"] == 1


@pytest.mark.parametrize(
    "lines, expect",
    [
        (['{"topic":"t","partition":0,"value":"ok"}', '{"topic":"t","partition":0}'], "in.jsonl:2: missing 'value'"),
        (
            ['{"topic":"t","partition":0,"value":"ok"}', '{"topic":"t","partition":9,"value":"v"}'],
            "record 2: partition 9 of topic 't' does not exist",
        ),
        (['{"topic":"nope","partition":0,"value":"v"}'], "topic 'nope' does not exist"),
        (["not json"], "in.jsonl:1: not valid JSON"),
        # a lone surrogate is valid JSON: a text header value is not Unicode, a base64 one not base64
        (
            ['{"topic":"t","partition":0,"value":"v","headers":{"h":"\\ud800"}}'],
            "in.jsonl:1: 'headers' value for 'h': a header value is not valid Unicode text",
        ),
        (
            ['{"topic":"t","partition":0,"value":"v","headers_b64":{"h":"\\ud800"}}'],
            "in.jsonl:1: 'headers_b64' value for 'h' is not valid base64",
        ),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(subprocess_env, store, tmp_path, lines, expect):
    ok(subprocess_env, "topic", "create", "t", "-p", "1")
    before = [o.key for o in store.list()]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    r = ctp(subprocess_env, "produce", str(path))
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and expect in r.stderr, r.stderr
    assert [o.key for o in store.list()] == before


@pytest.mark.parametrize(
    "args, expect",
    [
        (["topic", "create", "../etc", "-p", "1"], "Invalid value for 'NAME': invalid topic name '../etc'"),
        (
            ["topic", "create", "x", "-p", "0"],
            "Invalid value for '--partitions' / '-p': 0 is not in the range 1<=x<=100000",
        ),
        (["status", "--topic", "missing"], "topic 'missing' does not exist"),
        (["produce", "--generate", "--topic", "missing"], "topic 'missing' does not exist"),
        # bad option values: one line naming the option, nothing read or written
        (["read", "t", "0", "--limit", "-1"], "Invalid value for '--limit': -1 is not in the range x>=0"),
        (["read", "t", "0", "--from", "-5"], "Invalid value for '--from'"),
        (["gc", "--grace-seconds", "nan"], "Invalid value for '--grace-seconds': 'nan' is not a finite number >= 0"),
        (["gc", "--l1-grace-seconds", "inf"], "Invalid value for '--l1-grace-seconds': 'inf' is not a finite"),
        (["gc", "--tmp-grace-seconds", "-1"], "Invalid value for '--tmp-grace-seconds'"),
        (["gc", "--max-deletes", "-1"], "Invalid value for '--max-deletes'"),
        (["validate", "--grace-seconds", "soon"], "'soon' is not a number"),
        (["reconcile", "--target-file-mb", "0"], "Invalid value for '--target-file-mb': '0' is not > 0"),
        (["produce", "--generate", "--topic", "t", "--batch-records", "0"], "Invalid value for '--batch-records'"),
        (["produce"], "give either FILE or --generate"),
    ],
)
def test_cli_errors_are_one_line(subprocess_env, store, args, expect):
    r = ctp(subprocess_env, *args)
    assert r.returncode != 0
    assert expect in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert list(store.list(layout.TOPICS)) == []


@pytest.mark.parametrize(
    "args, expect",
    [
        (["topic", "create", "bad name", "-p", "1"], "Invalid value for 'NAME'"),
        (["topic", "create", "x", "-p", "0"], "Invalid value for '--partitions'"),
        (["topic", "create", "x", "-p", "100001"], "Invalid value for '--partitions'"),
        (["demo", "--topic", "bad name", "--no-reconcile"], "Invalid value for '--topic'"),
        (["demo", "--partitions", "0", "--no-reconcile"], "Invalid value for '--partitions'"),
    ],
)
def test_a_creating_command_with_a_bad_argument_creates_no_store(tmp_path, args, expect):
    """A mistyped store path must not be left behind as an empty store that later
    reads as one with no partitions."""
    root = tmp_path / "typo" / "store"
    r = ctp({**os.environ, "CTP_STORE": f"file://{root}"}, *args)
    assert r.returncode == 2 and expect in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "typo").exists()


def test_topic_create_twice_says_it_exists(subprocess_env):
    ok(subprocess_env, "topic", "create", "t", "-p", "2")
    r = ctp(subprocess_env, "topic", "create", "t", "-p", "2")
    assert r.returncode == 1 and "already exists with 2 partitions" in r.stderr
    out = ok(subprocess_env, "topic", "create", "t", "-p", "2", "--exist-ok")
    assert out.startswith("topic t exists with 2 partitions in "), out
    assert "created" not in out


def test_bad_store_urls(tmp_path):
    env = {**os.environ}
    for url, expect in [
        ("ftp://x/y", "unsupported store URL"),
        ("file://relative/path", "file:///absolute/path"),
        ("s3://user:hunter2@bucket/p", "credentials in the store URL"),
    ]:
        r = ctp(env, "epoch", "show", "--store", url)
        assert r.returncode == 1 and expect in r.stderr, r.stderr
        assert "hunter2" not in r.stderr


def test_s3_errors_never_show_credentials(s3_server):
    # Reads: SeaweedFS creates a missing bucket on the first PUT (AWS S3 refuses it).
    env = {**os.environ, **s3_server.env, "CTP_STORE": "s3://no-such-bucket-xyz/p"}
    for command in (["epoch", "show"], ["topic", "list"]):
        r = ctp(env, *command)
        assert r.returncode == 1 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
        assert "NoSuchBucket" in r.stderr
        assert s3_server.env["AWS_SECRET_ACCESS_KEY"] not in r.stderr + r.stdout
        assert s3_server.env["AWS_ACCESS_KEY_ID"] not in r.stderr + r.stdout


def test_unreachable_s3_endpoint_is_one_line(tmp_path):
    env = {
        **os.environ,
        "CTP_STORE": "s3://b/p",
        "CTP_S3_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
        "CTP_S3_MAX_ATTEMPTS": "1",
    }
    r = ctp(env, "epoch", "show")
    assert r.returncode == 1 and r.stderr.startswith("error: S3 GET of 'cluster/epoch/hint'"), r.stderr
    assert r.stderr.count("\n") == 1 and "s3cr3t-value" not in r.stderr


READING = [["status"], ["topic", "list"], ["epoch", "show"], ["gc"], ["read", "t", "0"], ["verify"], ["validate"]]


def test_a_missing_file_store_is_an_error_for_reading_commands_and_created_only_on_request(tmp_path):
    root = tmp_path / "typo" / "store"
    env = with_this_checkout({**os.environ, "CTP_STORE": f"file://{root}", "CTP_REPORT_DIR": str(tmp_path / "r")})
    for args in READING:
        r = ctp(env, *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: store file://{root} does not exist"), r.stderr
        assert "ctp topic create creates it" in r.stderr
    # writing commands other than topic create need the flag
    for args in (["epoch", "advance"], ["produce", "--generate", "--topic", "t"]):
        r = ctp(env, *args)
        assert r.returncode == 1 and "pass --create-store" in r.stderr, r.stderr
    assert not root.exists() and not root.parent.exists(), "a refused command created the store"
    assert ok(env, "epoch", "advance", "--create-store").strip() == "2"
    shutil.rmtree(root)
    ok(env, "topic", "create", "t", "-p", "1")
    assert "no partitions" not in ok(env, "status")
    # a path that is a file, not a directory, is named as such
    (tmp_path / "afile").write_text("x")
    r = ctp({**env, "CTP_STORE": f"file://{tmp_path / 'afile'}"}, "topic", "create", "t", "-p", "1")
    assert r.returncode == 1 and "is not a directory" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "args, expect",
    [
        (["produce"], "error: give either FILE or --generate"),
        (["produce", "x.jsonl", "--generate"], "error: give either FILE or --generate"),
        (["status", "--bogus"], "error: No such option '--bogus'"),
        (["read", "t"], "error: Missing argument 'PARTITION'"),
        (["read", "t", "0", "--limit", "-1"], "error: Invalid value for '--limit'"),
        (["read", "t", "0", "--from", "-1"], "error: Invalid value for '--from'"),
        (["nosuchcommand"], "error: No such command 'nosuchcommand'"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(subprocess_env, store, args, expect):
    r = ctp(subprocess_env, *args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.startswith(expect) and r.stderr.count("\n") == 1, r.stderr
    assert "unexpected" not in r.stderr and "Usage:" not in r.stderr


def test_missing_unreadable_and_non_utf8_input_files_name_the_file(subprocess_env, store, tmp_path):
    ok(subprocess_env, "topic", "create", "t", "-p", "1")
    missing = tmp_path / "nope.jsonl"
    r = ctp(subprocess_env, "produce", str(missing))
    assert r.returncode == 1 and r.stderr == f"error: {missing}: No such file or directory\n", r.stderr
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"topic":"t","partition":0,"value":"ok"}\n{"topic":"t","partition":0,"value":"caf\xe9"}\n')
    r = ctp(subprocess_env, "produce", str(bad))
    assert r.returncode == 1 and r.stderr.startswith(f"error: {bad}:2: not UTF-8"), r.stderr
    assert r.stderr.count("\n") == 1
    assert list(store.list(layout.L0_ROOT)) == []


def test_ctp_read_output_is_ctp_produce_input(subprocess_env, store, tmp_path):
    """Binary and text keys, values and headers survive read -> produce -> read."""
    env = subprocess_env
    ok(env, "topic", "create", "t", "-p", "1")
    sent = [
        {"topic": "t", "partition": 0, "value": "text", "key": "k", "headers": [["a", "1"], ["b", "ünï"]]},
        {"topic": "t", "partition": 0, "value_b64": "AP8=", "key_b64": "/w==", "headers_b64": [["h", "AP8="]]},
        {"topic": "t", "partition": 0, "value": "", "headers": [["x", "y"]], "timestamp": 5},
        {"topic": "t", "partition": 0, "value": "no key, no headers", "timestamp": 1700000000000},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in sent))
    ok(env, "produce", str(path))
    first = tmp_path / "first.jsonl"
    first.write_text(ok(env, "read", "t", "0"))
    assert json.loads(ok(env, "produce", str(first), "--json"))["accepted"] == 4
    lines = [json.loads(x) for x in ok(env, "read", "t", "0").splitlines()]
    assert [x.pop("offset") for x in lines] == list(range(8))
    assert lines[:4] == lines[4:]
    assert lines[1] == {
        "topic": "t",
        "partition": 0,
        "timestamp": lines[1]["timestamp"],
        **{k: v for k, v in sent[1].items() if k not in ("topic", "partition")},
    }
    assert lines[0]["headers"] == [["a", "1"], ["b", "ünï"]] and lines[2]["timestamp"] == 5
    # A terminal or pipe that is not UTF-8 still gets the records (JSON escapes them).
    r = ctp({**env, "PYTHONIOENCODING": "latin-1"}, "read", "t", "0", "--limit", "1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["headers"] == [["a", "1"], ["b", "ünï"]]


# A secret key may hold "/", "?" or "#": each ends the host part of a URL for urlparse,
# which then finds no password, and the secret read as a path.
SLASHED = [
    ("s3://AKIAEXAMPLE:SUPER/SECRET123@bucket/prefix", "credentials in the store URL"),
    ("s3://AKIAEXAMPLE:SUPER#SECRET123@bucket/prefix", "credentials in the store URL"),
    ("s3://AKIAEXAMPLE:SUPER?SECRET123@bucket/prefix", "credentials in the store URL"),
    ("hdfs://AKIAEXAMPLE:SUPER/SECRET123@namenode/x", "unsupported store URL"),
]


@pytest.mark.parametrize("url, expect", SLASHED)
def test_a_store_url_whose_secret_holds_a_slash_hash_or_question_mark_is_refused_unprinted(url, expect):
    r = ctp({**os.environ}, "epoch", "show", "--store", url)
    assert r.returncode == 1 and expect in r.stderr and r.stderr.count("\n") == 1, r.stderr
    for part in ("SUPER", "SECRET123", "AKIAEXAMPLE"):
        assert part not in r.stdout + r.stderr


def test_credentials_in_the_s3_endpoint_are_refused_unprinted():
    env = {
        **os.environ,
        "CTP_STORE": "s3://b/p",
        "CTP_S3_ENDPOINT_URL": "http://someone:SUPERSECRET123@127.0.0.1:9",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
    }
    r = ctp(env, "epoch", "show")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "credentials in CTP_S3_ENDPOINT_URL (http://127.0.0.1:9)" in r.stderr, r.stderr
    assert "SUPERSECRET123" not in r.stderr + r.stdout and "someone" not in r.stderr


def test_a_catalog_password_holding_a_slash_is_never_printed(tmp_path):
    env = {**os.environ, "CTP_STORE": f"file://{tmp_path}/store"}
    ok(env, "topic", "create", "orders", "-p", "1")
    r = ctp(env, "table", "show", "orders", "--catalog", "postgresql+psycopg://ctp:hun/ter2@127.0.0.1:1/ctp")
    assert r.returncode == 1 and r.stderr.startswith("error: cannot open the Iceberg catalog"), r.stderr
    assert "ter2" not in r.stderr + r.stdout and "hun/" not in r.stderr
    assert r.stderr.count("\n") == 1, r.stderr  # the driver's three lines, as one


def test_an_s3_server_that_accepts_and_never_answers_fails_within_its_timeouts():
    """A socket that accepts and never replies: without a read timeout of ctp's own,
    botocore waits 60 s an attempt (10 attempts: ten minutes)."""
    import socket
    import time

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        port = srv.getsockname()[1]
        env = {
            **os.environ,
            "CTP_STORE": "s3://b/p",
            "CTP_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "k",
            "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
            "CTP_S3_MAX_ATTEMPTS": "2",
            "CTP_S3_READ_TIMEOUT_S": "1",
        }
        t0 = time.monotonic()
        r = ctp(env, "epoch", "show")
        took = time.monotonic() - t0
    assert r.returncode == 1 and "Read timeout" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert took < 30, took  # two attempts of 1 s, and the process's start


def test_s3_timeouts_default_bounded_and_bad_values_name_their_variable():
    from ctp_state.errors import ConfigError
    from ctp_state.storage import S3Settings

    s = S3Settings.from_env({})
    cfg = s.client()._client_config
    assert (cfg.connect_timeout, cfg.read_timeout) == (5.0, 30.0)
    assert S3Settings.from_env({"CTP_S3_READ_TIMEOUT_S": "2.5"}).read_timeout_s == 2.5
    for bad in ("abc", "0", "-1", "nan", "inf"):
        with pytest.raises(ConfigError, match="CTP_S3_CONNECT_TIMEOUT_S must be"):
            S3Settings.from_env({"CTP_S3_CONNECT_TIMEOUT_S": bad})


@pytest.mark.parametrize(
    "env, expect",
    [
        ({"CTP_STORE": "s3://my bucket/p"}, "'my bucket' is not a bucket name"),
        ({"CTP_STORE": "s3://bucket:badport/p"}, "'bucket:badport' is not a bucket name"),
        ({"CTP_S3_ENDPOINT_URL": "not-a-url"}, "CTP_S3_ENDPOINT_URL must be an http(s)://host[:port] URL"),
        ({"AWS_REGION": "bad region!"}, "cannot make an S3 client: InvalidRegionError"),
        ({"AWS_PROFILE": "no-such-profile-xyz"}, "cannot make an S3 client: ProfileNotFound"),
    ],
)
def test_bad_s3_settings_are_one_line_naming_what_to_check(tmp_path, env, expect):
    base = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CTP_S3_"))},
        "CTP_STORE": "s3://b/p",
        "CTP_S3_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "CTP_S3_MAX_ATTEMPTS": "1",
    }
    r = ctp({**base, **env}, "epoch", "show")
    assert r.returncode == 1 and expect in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "s3cr3t-value" not in r.stderr


def test_status_names_a_newest_gc_record_that_does_not_read(tmp_path):
    root = tmp_path / "store"
    env = {**os.environ, "CTP_STORE": f"file://{root}", "CTP_REPORT_DIR": str(tmp_path / "r")}
    ok(env, "topic", "create", "t", "-p", "1")
    ok(env, "gc")
    ok(env, "gc")
    newest = sorted((root / "gc" / "history").glob("*.json"))[-1]
    newest.write_bytes(b"xx")
    r = ctp(env, "status")
    assert r.returncode == 0, r.stderr
    assert f"warning: the newest GC record ({int(newest.stem)}) does not read" in r.stderr, r.stderr
    assert "GC: no run yet" not in r.stdout and "does not read" in r.stdout


@pytest.mark.parametrize(
    "args, env, expect",
    [
        (["reconcile", "--topic", "nosuch"], {}, "topic 'nosuch' does not exist"),
        (["reconcile"], {"CTP_SPARK_INLINE_PLAN_MB": "abc"}, "CTP_SPARK_INLINE_PLAN_MB must be a number of MiB >= 0"),
        (["reconcile"], {"CTP_SPARK_INLINE_PLAN_MB": "nan"}, "CTP_SPARK_INLINE_PLAN_MB must be a number of MiB >= 0"),
    ],
)
def test_reconcile_checks_its_input_before_spark_starts(tmp_path, args, env, expect):
    """A master Spark cannot start: had the command started Spark first, the error
    would be Spark's."""
    base = {**os.environ, "CTP_STORE": f"file://{tmp_path}/store", "CTP_SPARK_MASTER": "no-such-master"}
    ok(base, "topic", "create", "t", "-p", "1")
    r = ctp({**base, **env}, *args)
    assert r.returncode == 1 and r.stderr.startswith(f"error: {expect}") and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("app", ["reconcile.py", "compact.py"])
def test_the_spark_apps_refuse_a_store_that_does_not_exist_before_spark_starts(tmp_path, app):
    import subprocess
    import sys

    root = tmp_path / "typo" / "store"
    r = subprocess.run(
        [sys.executable, os.path.join(REPO, "spark_apps", app), "--store", f"file://{root}", "--master", "no-such"],
        env=with_this_checkout({**os.environ}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and r.stderr == f"error: store file://{root} does not exist (no such directory)\n", (
        r.stderr
    )
    assert not (tmp_path / "typo").exists()


def test_a_report_dir_that_is_a_file_and_an_unpublished_tables_files_say_so(tmp_path):
    env = {**os.environ, "CTP_STORE": f"file://{tmp_path}/store", "CTP_REPORT_DIR": str(tmp_path / "afile")}
    (tmp_path / "afile").write_text("not a directory")
    ok(env, "topic", "create", "t", "-p", "1")
    r = ctp(env, "gc", "--dry-run")
    assert r.returncode == 1 and r.stderr == f"error: CTP_REPORT_DIR {tmp_path / 'afile'} is not a directory\n"
    r = ctp(env, "table", "files", "t")
    assert r.returncode == 0 and r.stdout == "" and "table ctp.t: not published yet" in r.stderr, r.stderr
