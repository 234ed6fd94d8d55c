"""Backends are chosen by URL scheme through one registry."""

from __future__ import annotations

import pytest

from ctp_state.errors import ConfigError
from ctp_state.storage import SCHEMES, LocalStore, S3Store, open_store, register, registry


def test_each_built_in_scheme_opens_its_backend(tmp_path):
    assert set(SCHEMES) == {"file", "s3"}
    assert isinstance(open_store(f"file://{tmp_path}/s", {}), LocalStore)
    s3 = open_store(
        "s3://bucket/pre",
        {"CTP_S3_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"},
    )
    assert isinstance(s3, S3Store) and s3.url == "s3://bucket/pre/"


def test_an_unknown_scheme_names_the_ones_that_work():
    with pytest.raises(ConfigError, match=r"unsupported store URL 'gs://b/p': use file:// or s3://"):
        open_store("gs://b/p", {})


def test_a_registered_scheme_is_opened_by_its_opener(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_OPENERS", dict(registry._OPENERS))  # leave the process's registry alone
    register(
        "mem", lambda parsed, url, env, create: LocalStore(f"{tmp_path}/{parsed.netloc}", fsync=env.get("F") == "1")
    )
    store = open_store("mem://here", {"F": "0"})
    store.put("k", b"v")
    assert (tmp_path / "here" / "k").read_bytes() == b"v"


def test_the_environment_is_the_one_passed_in(tmp_path, monkeypatch):
    """Nothing below the entry points reads os.environ: a setting only in the process's
    environment does not reach the store."""
    monkeypatch.setenv("CTP_FSYNC", "0")
    assert open_store(f"file://{tmp_path}/a", {})._fsync is True
    assert open_store(f"file://{tmp_path}/b", {"CTP_FSYNC": "0"})._fsync is False
