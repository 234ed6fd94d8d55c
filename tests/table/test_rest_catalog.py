"""The table on a real Iceberg REST catalog: SeaweedFS's, started by
``python -m ctp_state.local_s3 --catalog`` as a user starts it.

The tests every catalog runs (exactly-once publish, kills at each publish crash point,
racing publishers, GC expiry and sweep, topic delete and re-create, the gate's table
checks, every reader) take the ``catalogs`` fixture, whose ``rest`` case is this
catalog; here is what only a REST catalog has: a table another Iceberg client finds
through it, metadata in the catalog's warehouse, and its authentication.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ctp_state.errors import ConfigError
from ctp_state.table.catalog import CatalogConfig, drop_if_at, open_catalog
from tests.support import REPO, with_this_checkout
from tests.support.table import committed, do_publish, load, sortable, table_of

#: What a user's own Iceberg client does with the catalog (not ctp's configuration):
#: pyiceberg's RestCatalog, SigV4 with the server's credentials, then a full scan.
READ_BACK = """
import json, os, sys
import pyarrow as pa
from pyiceberg.catalog.rest import RestCatalog
env = os.environ
region = env["AWS_DEFAULT_REGION"]
catalog = RestCatalog(
    "mine",
    uri=env["CTP_CATALOG_URI"],
    warehouse=env["CTP_CATALOG_WAREHOUSE"],
    **{
        "rest.sigv4-enabled": "true", "rest.signing-name": "s3tables", "rest.signing-region": region,
        "client.access-key-id": env["AWS_ACCESS_KEY_ID"], "client.secret-access-key": env["AWS_SECRET_ACCESS_KEY"],
        "client.region": region, "s3.endpoint": env["CTP_S3_ENDPOINT_URL"], "s3.region": region,
        "s3.access-key-id": env["AWS_ACCESS_KEY_ID"], "s3.secret-access-key": env["AWS_SECRET_ACCESS_KEY"],
    },
)
table = catalog.load_table(("ctp", "demo"))
rows = table.scan().to_arrow().select(["partition", "offset", "value"]).to_pylist()
print(json.dumps({
    "metadata": table.metadata_location,
    "rows": sorted([r["partition"], r["offset"], r["value"].hex()] for r in rows),
}))
"""


def test_the_demo_on_a_local_s3_with_its_catalog_leaves_a_table_any_client_reads(tmp_path):
    """``python -m ctp_state.local_s3 --dir D --catalog -- ctp demo``: the topic's table is
    in the REST catalog, and pyiceberg's own RestCatalog reads exactly the records
    ``ctp read`` returns."""
    script = tmp_path / "read_back.py"
    script.write_text(READ_BACK)
    reads = " && ".join(f"ctp read demo {p} --json > {tmp_path}/read-{p}.jsonl" for p in range(2))
    env = with_this_checkout({**os.environ, "HOME": str(tmp_path)})
    for k in ("CTP_STORE", "CTP_CATALOG_URI", "CTP_CATALOG_WAREHOUSE"):
        env.pop(k, None)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctp_state.local_s3",
            "--dir",
            str(tmp_path / "s3"),
            "--catalog",
            "--",
            "bash",
            "-c",
            f"ctp demo --rounds 2 --records 1500 --partitions 2 --no-gc && {reads} && "
            f"{sys.executable} {script} > {tmp_path}/table.json",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    table = json.loads((tmp_path / "table.json").read_text())
    assert table["metadata"].startswith("s3://warehouse/ctp/demo/metadata/"), table["metadata"]
    read = []
    for p in range(2):
        for line in (tmp_path / f"read-{p}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            read.append([p, rec["offset"], _value_hex(rec)])
    assert len(read) == 3000
    assert table["rows"] == sorted(read)


def _value_hex(rec: dict) -> str:
    import base64

    if "value_b64" in rec:
        return base64.b64decode(rec["value_b64"]).hex()
    return rec["value"].encode().hex()


def test_dropping_a_rest_table_leaves_the_l1_files_it_named(store, s3_server, tmp_path):
    """The L1 files are the only copy of the records: a REST catalog's drop (what the GC
    does for a deleted incarnation, what a publish does to replace a stale table) must
    not take them with it -- ctp never asks it to purge, and they live outside its
    warehouse."""
    from ctp_state.topics import create_topic
    from tests.conftest import rest_catalog

    config = rest_catalog(s3_server)
    create_topic(store, "t", 3)
    load(store)
    do_publish(store, config, tmp_path)
    before = committed(store)
    table = table_of(store, config, tmp_path)
    paths = [task.file.file_path for task in table.scan().plan_files()]
    assert paths and all(p.startswith(store.url) for p in paths)
    catalog = open_catalog(store, config, home=str(tmp_path))
    assert drop_if_at(catalog, (config.namespace, "t"), table.metadata_location)
    assert all(store.key_of(p) is not None and store.head(store.key_of(p)) is not None for p in paths)
    assert sortable(committed(store)).equals(sortable(before))
    assert do_publish(store, config, tmp_path).files_added == 6  # a new table, from the log


def test_a_rest_catalog_that_refuses_the_credentials_is_one_line_without_the_secret(store, s3_server, tmp_path):
    from ctp_state.storage import open_store
    from ctp_state.topics import create_topic
    from tests.conftest import rest_catalog

    good = rest_catalog(s3_server)
    secret = "wrong-secret-do-not-print-" + "x" * 10
    bad_env = {**s3_server.env, "AWS_SECRET_ACCESS_KEY": secret}
    bad_store = open_store(store.url, bad_env) if store.url.startswith("s3://") else store
    bad = CatalogConfig.from_env({**bad_env, **good.as_env()})
    create_topic(store, "t", 1)
    with pytest.raises(Exception) as e:
        do_publish(bad_store, bad, tmp_path)
    assert secret not in str(e.value) and "\n" not in str(e.value).strip()
    assert "Forbidden" in type(e.value).__name__ or "Forbidden" in str(e.value) or "refused" in str(e.value)


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"CTP_CATALOG_URI": "http://127.0.0.1:1"}, "needs a warehouse"),
        ({"CTP_CATALOG_URI": "http://x", "CTP_CATALOG_WAREHOUSE": "w", "CTP_CATALOG_AUTH": "basic"}, "must be one of"),
        ({"CTP_CATALOG_URI": "http://x", "CTP_CATALOG_WAREHOUSE": "w", "CTP_CATALOG_AUTH": "token"}, "needs a token"),
        (
            {"CTP_CATALOG_URI": "http://x", "CTP_CATALOG_WAREHOUSE": "w", "CTP_CATALOG_AUTH": "oauth2"},
            "client_id:secret",
        ),
        ({"CTP_CATALOG_URI": "sqlite:////tmp/c.db", "CTP_CATALOG_WAREHOUSE": "w"}, "apply to a REST catalog"),
    ],
)
def test_rest_settings_that_cannot_work_are_refused_in_one_line(env, why):
    with pytest.raises(ConfigError, match=why):
        CatalogConfig.from_env(env)


def test_rest_secrets_stay_out_of_the_settings_repr():
    c = CatalogConfig.from_env(
        {
            "CTP_CATALOG_URI": "https://cat.example/api",
            "CTP_CATALOG_WAREHOUSE": "w",
            "CTP_CATALOG_AUTH": "oauth2",
            "CTP_CATALOG_CREDENTIAL": "client:very-secret-value",
            "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
        }
    )
    assert "very-secret-value" not in repr(c) and "aws-secret-value" not in repr(c)
    assert c.rest_properties(_NoS3())["credential"] == "client:very-secret-value"


class _NoS3:
    url = "file:///nowhere"


def test_publishers_racing_to_create_the_namespace_and_the_table_all_succeed(store, s3_server, tmp_path):
    """A REST catalog answers NoSuchNamespace (not NoSuchTable) for a table of a missing
    namespace, and a namespace another publisher is creating may not be visible for a
    moment: publishers racing on a fresh namespace all publish, each file once."""
    import threading

    from ctp_state.topics import create_topic
    from tests.conftest import rest_catalog

    create_topic(store, "t", 3)
    load(store, rounds=1)
    for _ in range(3):
        config = rest_catalog(s3_server)
        errors: list[BaseException] = []

        def publisher(config=config, errors=errors) -> None:
            try:
                do_publish(store, config, tmp_path)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=publisher) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        files = [task.file.file_path for task in table_of(store, config, tmp_path).scan().plan_files()]
        assert len(files) == len(set(files)) == 3


def test_a_gc_before_anything_was_published_to_a_rest_catalog_reports_no_table_error(store, s3_server, gate, tmp_path):
    from ctp_state.gc import run_gc
    from ctp_state.table.maintenance import CatalogTables
    from ctp_state.topics import create_topic
    from tests.conftest import rest_catalog

    create_topic(store, "t", 1)
    load(store, rounds=1, partitions=1)
    rec = run_gc(store, gate=gate, tables=CatalogTables(store, rest_catalog(s3_server), home=str(tmp_path)))
    assert rec.status == "ok" and rec.table_errors == (), rec.table_errors
