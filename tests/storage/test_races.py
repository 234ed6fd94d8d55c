"""Racing real processes against both backends (the local filesystem, and SeaweedFS over
HTTP with nothing in front of it): atomic create, epoch advance, appends. Each race is
also run once with create-if-absent replaced by a plain PUT, to show it would catch that."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ctp_state.entries import Placeholder
from ctp_state.epoch import ClusterEpoch
from ctp_state.topics import create_topic
from tests.support import plog

WORKER = os.path.join(os.path.dirname(__file__), "race_worker.py")


def race(env: dict[str, str], n: int, *args: str) -> list:
    start_at = f"{time.time() + 3.0:.3f}"  # after every interpreter has started
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, args[0], start_at, f"w{i}", *args[1:]],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_put_if_absent_has_exactly_one_winner(store, subprocess_env):
    results = race(subprocess_env, 8, "put")
    assert sorted(results) == ["lost"] * 7 + ["won"]
    winner = results.index("won")
    assert store.get("race/key") == f"w{winner}".encode()


def test_concurrent_epoch_advancers_never_share_or_regress(store, subprocess_env):
    per = 5
    results = race(subprocess_env, 4, "advance", str(per))
    values = [v for r in results for v in r]
    assert len(values) == len(set(values)) == 4 * per  # no two advancers got the same value
    for r in results:
        assert r == sorted(r) and len(set(r)) == len(r)  # each advancer saw C only grow
    assert sorted(values) == list(range(2, 2 + 4 * per))  # dense from the implicit epoch 1
    assert ClusterEpoch(store).current() == 1 + 4 * per


def test_appenders_in_separate_processes_never_lose_or_reorder(store, subprocess_env):
    create_topic(store, "race", 1)
    per, procs = 12, 4
    results = race(subprocess_env, procs, "append", "race", "0", str(per))
    log = plog(store, "race", 0)
    entries = list(log.entries())
    assert [o for o, _ in entries] == list(range(1 + per * procs))  # dense, nothing lost
    by_key = {e.l0_key: o for o, e in entries if isinstance(e, Placeholder)}
    for i, r in enumerate(results):
        assert all(accepted for _, _, accepted in r)
        offsets = [o for o, _, _ in r]
        assert offsets == sorted(offsets)  # each writer's entries in its own order
        for j, (offset, base, _) in enumerate(r):
            assert by_key[f"l0/000/{1:018d}/w{i}-{j}.l0"] == offset  # each exactly where it said
            assert base == offset - 1  # one record per placeholder, dense record offsets
    state = plog(store, "race", 0, snapshot_every=16).read_state()
    assert state.next_offset == per * procs and state.lag_entries == per * procs
    # Appenders never snapshot (their states hold entries they never read back); a
    # reader that folded the raced log from the store does, at its end.
    assert plog(store, "race", 0).read_snapshot().applied_offset == per * procs


def test_the_races_catch_a_create_if_absent_that_is_a_plain_put(store, subprocess_env):
    """With ``put_if_absent`` planted as a plain overwrite in every racer, the same races
    find what the store's atomic create prevents: several winners of one key, and
    appenders that overwrite each other's log entries."""
    env = {**subprocess_env, "CTP_SIM_PLANT": "create_is_plain_put"}
    assert race(env, 8, "put") == ["won"] * 8
    create_topic(store, "race", 1)
    per, procs = 12, 4
    results = race(env, procs, "append", "race", "0", str(per))
    stopped = [r for r in results if r and r[-1] == "forked"]
    claimed = [item[0] for r in results for item in r if item != "forked" and item[2]]
    # every appender was told "accepted" (or, reading a log whose entries were overwritten
    # under it, stopped on the fork: LogForked, a placeholder after another entry than
    # the one it was written after)...
    assert len(claimed) + sum(per - (len(r) - 1) for r in stopped) == per * procs
    assert len(set(claimed)) < len(claimed)  # ...for offsets that others were told too
    assert len(list(plog(store, "race", 0).entries())) < 1 + len(claimed)  # entries lost
