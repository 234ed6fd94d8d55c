"""Attacks (round-four review of the fixes; each HELD) on ``ObjectStore.list_all`` on the real SeaweedFS server."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ctp_state.storage import open_store


def test_list_all_pages_across_name_levels_on_seaweedfs(s3_server):
    """ATTACK: ``list_all`` is one ListObjectsV2 walk continued by ContinuationToken.
    SeaweedFS lists directory by directory (``t/`` before ``t-2/`` and ``t.x/``, which
    sort before ``t/`` byte-wise). With more than one page (1000 keys) the continuation
    point sits inside ``t/``: a server that resumes by byte comparison with the last key
    would skip ``t-2/`` and ``t.x/`` entirely. Compare the listing with what was written
    (``meta/history/<name>/<seq>`` shaped keys). HELD: every key
    comes back once, in byte order."""
    store = open_store(s3_server.url("ctp-review"), s3_server.env)
    keys = [f"meta/history/t/{i:020d}.json" for i in range(1100)]
    keys += [f"meta/history/t-2/{i:020d}.json" for i in range(1100)]
    keys += [f"meta/history/t.x/{i:020d}.json" for i in range(5)]
    keys += [f"meta/history/t0/{i:020d}.json" for i in range(5)]
    keys += ["meta/history/s/00000000000000000000.json", "meta/history/u/00000000000000000000.json"]
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda k: store.put(k, b"x"), keys))
    got = [o.key for o in store.list_all("meta/history/")]
    assert len(got) == len(set(got))
    missing = sorted(set(keys) - set(got))
    assert not missing, f"{len(missing)} keys missing, e.g. {missing[:3]}"
    assert got == sorted(keys, key=str.encode)
