"""One contract for the object store, run against the local filesystem, a real S3 server
(SeaweedFS) and moto's S3 emulator, both over HTTP: a difference between S3
implementations that ctp would trip over is a failing test here, not a surprise in
production."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from ctp_state.errors import InvalidKey, KeyExists, ObjectNotFound, StoreError
from ctp_state.storage import MAX_DELETE_BATCH, ObjectStore, open_store


@pytest.fixture(params=["file", "seaweedfs", "moto"])
def store(request: pytest.FixtureRequest, tmp_path) -> ObjectStore:
    """A fresh, empty store on each backend (this module's own: moto included)."""
    if request.param == "file":
        return open_store(f"file://{tmp_path}/store", {})
    server = request.getfixturevalue("s3_server" if request.param == "seaweedfs" else "moto")
    return open_store(server.url("contract"), server.env)


def put_all(store: ObjectStore, names: list[str]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: store.put(k, b"x"), names))


def keys(
    store: ObjectStore, prefix: str = "", start_after: str | None = None, end_before: str | None = None
) -> list[str]:
    return [o.key for o in store.list(prefix, start_after=start_after, end_before=end_before)]


def test_put_get_head_roundtrip(store: ObjectStore):
    store.put("a/b/c.bin", b"hello")
    assert store.get("a/b/c.bin") == b"hello"
    info = store.head("a/b/c.bin")
    assert info is not None and info.size == 5 and info.key == "a/b/c.bin"
    store.put("a/b/c.bin", b"replaced")
    assert store.get("a/b/c.bin") == b"replaced"
    assert store.head("a/b/missing") is None


@pytest.mark.parametrize("size", [0, 1, (1 << 16) - 1, 1 << 16, (1 << 16) + 1, (1 << 20) + 3 * (1 << 16) + 7])
def test_get_returns_every_byte_whatever_the_size(store: ObjectStore, size: int):
    """The file store reads in a first chunk of 64 KiB and then until the end: an object
    shorter than, exactly, and longer than that chunk, and past 1 MiB, comes back whole."""
    data = bytes((i * 7 + size) % 251 for i in range(size))
    store.put(f"sizes/{size}.bin", data)
    assert store.get(f"sizes/{size}.bin") == data


def test_a_key_that_names_a_prefix_of_other_keys_is_not_found(store: ObjectStore):
    """On the file store the key is a directory (opening one read-only succeeds; reading
    it does not), or runs through a file: neither is an object."""
    store.put("dir/obj.bin", b"x")
    for key in ("dir", "dir/obj.bin/below"):
        with pytest.raises(ObjectNotFound):
            store.get(key)


def test_get_missing_raises_not_found(store: ObjectStore):
    with pytest.raises(ObjectNotFound) as e:
        store.get("nope/x")
    assert e.value.key == "nope/x"
    with pytest.raises(ObjectNotFound):
        store.get_range("nope/x", 0, 3)


def test_get_range(store: ObjectStore):
    store.put("r", bytes(range(100)))
    assert store.get_range("r", 10, 5) == bytes(range(10, 15))
    assert store.get_range("r", 95, 10) == bytes(range(95, 100))  # short at the end
    assert store.get_range("r", 0, 0) == b""


def test_get_tail_returns_the_last_bytes_and_the_size(store: ObjectStore):
    store.put("r", bytes(range(100)))
    assert store.get_tail("r", 10) == (bytes(range(90, 100)), 100)
    assert store.get_tail("r", 1000) == (bytes(range(100)), 100)  # all of it when shorter
    store.put("empty", b"")
    assert store.get_tail("empty", 10) == (b"", 0)
    with pytest.raises(ObjectNotFound) as e:
        store.get_tail("nope/x", 10)
    assert e.value.key == "nope/x"


def test_put_if_absent_creates_once(store: ObjectStore):
    store.put_if_absent("log/0", b"first")
    with pytest.raises(KeyExists) as e:
        store.put_if_absent("log/0", b"second")
    assert e.value.key == "log/0"
    assert store.get("log/0") == b"first"


def test_list_is_bytewise_key_order_across_directories_or_says_the_server_is_not(store: ObjectStore):
    """'-' and '.' sort before '/', so a directory walk gets these wrong: SeaweedFS lists
    'a/x' before 'a-b/x'. A store lists in byte order, or refuses, naming the two keys;
    it never hands a caller (a bounded GC listing) keys out of order."""
    names = ["a/x", "a-b/x", "a.c", "a/y/z", "ab", "a0", "b", "A"]
    for n in names:
        store.put(n, n.encode())
    try:
        listed = keys(store)
    except StoreError as e:
        assert e.code == "ListOrder" and "'a-b/x' after 'a/y/z'" in str(e), e
    else:
        assert listed == sorted(names, key=str.encode)
    # One level at a time, every backend answers in byte order (sorted on the client).
    dirs, objects = store.list_level("")
    assert dirs == ["a-b/", "a/"] and [o.key for o in objects] == ["A", "a.c", "a0", "ab", "b"]


@pytest.mark.parametrize("level", ["meta/history/", "logs/", "l1/", "tables/t/0123456789abcdef0123456789abcdef/"])
def test_list_all_walks_a_name_level_in_byte_order(store, level):
    """The store verb for a range that crosses a name level: every key under it, once,
    in byte order, on a server that walks directories too -- across pages."""
    names = [f"{level}{n}/{i:020d}.json" for n in ("t", "t-2", "t.x", "t-2.y", "t0") for i in range(3)]
    names += [f"{level}t-2/many/{i:06d}" for i in range(1050)]  # past one page
    names.append(f"{level}t.json")  # a file beside the directory it begins
    put_all(store, names)
    listed = [o.key for o in store.list_all(level)]
    assert listed == sorted(names, key=str.encode)


def test_keys_shaped_as_ctp_writes_them_list_in_order_on_every_backend(store: ObjectStore):
    """What ctp lists with bounds: fixed-width digit names level by level (L0 spread and
    epoch directories, log offsets, sequences), which every backend orders alike."""
    names = [f"l0/{s:03d}/{e:018d}/{u}.l0" for s in (0, 7, 10) for e in (1, 9, 10, 100) for u in ("A-1", "a_2", "b")]
    names += [f"logs/t.x-y/{p:06d}/{o:020d}.json" for p in (0, 1, 10) for o in (0, 9, 10)]
    put_all(store, names)
    assert keys(store) == sorted(names, key=str.encode)
    bound = "l0/007/000000000000000010/"
    assert keys(store, "l0/007/", start_after="l0/007/000000000000000001/b.l0", end_before=bound) == [
        f"l0/007/{9:018d}/{u}.l0" for u in ("A-1", "a_2", "b")
    ]


def test_list_prefix_and_start_after(store: ObjectStore):
    for i in range(20):
        store.put(f"p/{i:03d}", b"x")
    store.put("q/000", b"x")
    store.put("p0", b"x")
    assert keys(store, "p/") == [f"p/{i:03d}" for i in range(20)]
    assert keys(store, "p/", start_after="p/014") == [f"p/{i:03d}" for i in range(15, 20)]
    assert keys(store, "p/01") == [f"p/{i:03d}" for i in range(10, 20)]
    assert keys(store, "p", start_after="p/019") == ["p0"]
    assert keys(store, "", start_after="p0") == ["q/000"]
    assert keys(store, "zzz") == []


def test_list_end_before_stops_at_the_bound_across_directories_and_pages(store: ObjectStore):
    """``end_before`` is exclusive, works with ``start_after``, across directory levels
    and past one page (1000 keys)."""
    names = [f"l0/001/{e:018d}/k{i:04d}.l0" for e in (3, 4, 5) for i in range(3)]
    names += ["l0/001/000000000000000004x", "l0/002/000000000000000001/a.l0"]
    put_all(store, names)
    below = sorted((n for n in names if n.startswith("l0/001/")), key=str.encode)
    bound = "l0/001/000000000000000005/"
    assert keys(store, "l0/001/", end_before=bound) == [n for n in below if n < bound]
    assert keys(store, "l0/001/", start_after=below[1], end_before=bound) == [n for n in below[2:] if n < bound]
    assert keys(store, "l0/001/", end_before="l0/001/000000000000000004/k0001.l0") == below[:4]
    assert keys(store, "l0/001/", end_before="l0/001/") == []
    assert keys(store, "l0/", end_before="l0/002/") == below
    many = [f"many/{i:06d}" for i in range(MAX_DELETE_BATCH + 150)]
    put_all(store, many)
    assert keys(store, "many/", end_before="many/001100") == many[:1100]


def test_list_paginates_past_1000_keys(store: ObjectStore):
    n = MAX_DELETE_BATCH + 150  # two pages
    put_all(store, [f"many/{i:06d}" for i in range(n)])
    listed = keys(store, "many/")
    assert listed == [f"many/{i:06d}" for i in range(n)]
    assert keys(store, "many/", start_after="many/000999")[:2] == ["many/001000", "many/001001"]


def test_list_prefixes(store: ObjectStore):
    for k in ["l0/000/1/a", "l0/000/2/b", "l0/007/1/c", "l0/010/1/d", "l1/x"]:
        store.put(k, b"")
    assert store.list_prefixes("l0/") == ["l0/000/", "l0/007/", "l0/010/"]
    assert store.list_prefixes("") == ["l0/", "l1/"]
    assert store.list_prefixes("none/") == []
    store.put("l0/stray", b"xy")
    dirs, objects = store.list_level("l0/")
    assert dirs == ["l0/000/", "l0/007/", "l0/010/"]
    assert [(o.key, o.size) for o in objects] == [("l0/stray", 2)]


def test_delete_many_batches_over_1000(store: ObjectStore):
    n = MAX_DELETE_BATCH + 234
    names = [f"d/{i:05d}" for i in range(n)]
    put_all(store, names + ["keep"])
    res = store.delete_many(names + ["d/never-existed"])
    assert not res.errors
    assert len(res.deleted) == n + 1  # absent keys count as deleted (S3 semantics)
    assert keys(store) == ["keep"]


def test_batches_sent_to_the_backend_never_exceed_1000(store: ObjectStore, monkeypatch):
    sizes: list[int] = []
    real = store._delete_batch

    def spy(batch):
        sizes.append(len(batch))
        return real(batch)

    monkeypatch.setattr(store, "_delete_batch", spy)
    store.delete_many(f"k/{i}" for i in range(2500))
    assert sizes == [1000, 1000, 500]


@pytest.mark.parametrize("bad", ["", "/abs", "a//b", "a/../b", "../x", "a/./b", "trail/", "nul\x00"])
def test_invalid_keys_are_refused_before_any_io(store: ObjectStore, bad: str):
    with pytest.raises(InvalidKey):
        store.put(bad, b"x")
    with pytest.raises(InvalidKey):
        store.put_if_absent(bad, b"x")
    assert keys(store) == []
