"""Listings that cross a name level (round-four review, defect 3).

'-' and '.' sort before '/', so a server that lists directory by directory (SeaweedFS)
lists ``meta/history/t/...`` before ``meta/history/t-2/...`` where byte order puts them
the other way round. Every level of ctp's layout whose names are not of one width --
topic names, and so every ``<space>``; table namespaces; producer ids -- must list
correctly on both orders. Before the fix, once topics ``t`` and ``t-2`` had both been
deleted, every ``ctp topic list``, ``ctp gc``, ``ctp status`` and ``ctp verify`` on
SeaweedFS failed for good ("does not list keys in byte order").

Run on the local store and on SeaweedFS (the ``store`` fixture).
"""

from __future__ import annotations

from ctp_state import layout
from ctp_state.deletion import REMOVAL_ORDER, delete_topic, state_keys
from ctp_state.epoch import ClusterEpoch
from ctp_state.gc import run_gc
from ctp_state.incarnations import all_names
from ctp_state.l0 import Record
from ctp_state.producer import Producer
from ctp_state.reconcile import run_reconcile
from ctp_state.status import read_states, select_topics
from ctp_state.table.catalog import CatalogConfig
from ctp_state.table.maintenance import CatalogTables
from ctp_state.table.publish import publish
from ctp_state.topics import create_topic, get_topic, list_topics
from ctp_state.verify import verify
from tests.support import ctp_on_path as ctp, values
from tests.support.topics import NOW

#: Names that differ by '-' and '.' where byte order and a directory walk disagree
#: ('t' is a beginning of the others; '-' < '.' < '/').
NAMES = ("t", "t-2", "t.x", "t-2.y")


def _load(store, name: str, tag: str, n: int = 3) -> list[bytes]:
    sent = [f"{name}:{tag}{i}".encode() for i in range(n)]
    with Producer(store, epoch_ttl_s=0, producer_id=f"p-{tag}") as prod:
        v = prod.write([((name, 0), [Record(s, None, 1000 + i) for i, s in enumerate(sent)])])[0]
        assert v.accepted, v.error
    return sent


def _settle(store) -> None:
    for _ in range(3):
        ClusterEpoch(store).advance()
        run_reconcile(store)


def _publish(store, name: str, namespace: str, home: str) -> None:
    from ctp_state.table.catalog import open_catalog

    config = CatalogConfig(uri=f"sqlite:///{home}/catalog-{namespace}.db", namespace=namespace)
    catalog = open_catalog(store, config, home=home)
    t = get_topic(store, name)
    publish(store, catalog, t, config, read_states=lambda t: read_states(store, [t]))


def test_every_command_lists_across_names_that_differ_by_dash_and_dot(store, gate, tmp_path, store_url, subprocess_env):
    """Topics (and so spaces under logs/, snapshots/, l1/, tables/ and meta/history/),
    table namespaces and producer ids named alike but for '-' and '.'; two of the topics
    deleted, the GC removes them and collects, and every command keeps working."""
    for name in NAMES:
        create_topic(store, name, 1)
    sent = {name: _load(store, name, "a") for name in NAMES}
    _settle(store)
    for name in NAMES:
        for ns in ("ctp", "ctp_2"):
            _publish(store, name, ns, str(tmp_path))
    delete_topic(store, "t")
    delete_topic(store, "t-2")

    names = {st.name: st for st in all_names(store)}
    assert set(names) == set(NAMES)
    assert names["t"].current is None and names["t-2"].current is None
    assert sorted(t.name for t in list_topics(store)) == ["t-2.y", "t.x"]
    assert [t.name for t in select_topics(store)] == ["t-2.y", "t.x"]
    report = verify(store)
    assert not [f for f in report.cluster if f.severity == "error"], report.cluster

    tables = CatalogTables(
        store,
        CatalogConfig(uri=f"sqlite:///{tmp_path}/catalog-ctp.db", namespace="ctp"),
        home=str(tmp_path),
        keep=1,
        max_age_s=0,
    )
    rec = run_gc(store, gate=gate, config=NOW, tables=tables)
    assert rec.status == "ok", rec
    gone = {st.name: st for st in all_names(store)}
    for name in ("t", "t-2"):
        (removed,) = gone[name].removed
        assert not [o.key for root in REMOVAL_ORDER for o in state_keys(store, removed, root)]
    for name in ("t.x", "t-2.y"):
        assert values(store, name, 0) == sent[name]
        t = get_topic(store, name)
        # the survivors' spaces are whole: their logs, L1 files and tables
        assert state_keys(store, t, layout.LOGS_ROOT) and state_keys(store, t, layout.L1_ROOT)
        assert len(store.list_level(f"{layout.TABLES_ROOT}{layout.space(t.name, t.key_id)}/")[0]) == 2

    # the names live again, and a second GC collects what they write
    create_topic(store, "t", 1)
    again = _load(store, "t", "b")
    _settle(store)
    rec = run_gc(store, gate=gate, config=NOW, tables=tables)
    assert rec.status == "ok", rec
    assert values(store, "t", 0) == again
    assert values(store, "t.x", 0) == sent["t.x"]

    url, env = store_url
    for cmd in (["topic", "list"], ["status"], ["verify"], ["gc", "--dry-run"]):
        out = ctp({**subprocess_env, **env}, *cmd, "--store", url)
        assert out.returncode == 0, (cmd, out.stderr)
