"""A child process for the race tests. Opens the store named by $CTP_STORE, waits for
a shared start time so the racers really collide, does one job, prints JSON."""

from __future__ import annotations

import json
import os
import sys
import time

from ctp_state.entries import Placeholder
from ctp_state.epoch import ClusterEpoch
from ctp_state.errors import KeyExists, LogForked
from ctp_state.producer import PartitionWriter
from ctp_state.storage import open_store
from tests.support import plog


def main() -> None:
    mode, start_at, ident = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    store = open_store(os.environ["CTP_STORE"], os.environ)
    time.sleep(max(0.0, start_at - time.time()))
    if mode == "put":
        try:
            store.put_if_absent("race/key", ident.encode())
            print(json.dumps("won"))
        except KeyExists:
            print(json.dumps("lost"))
    elif mode == "advance":
        ce = ClusterEpoch(store)
        print(json.dumps([ce.advance() for _ in range(int(sys.argv[4]))]))
    elif mode == "append":
        topic, partition, n = sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
        writer = PartitionWriter(plog(store, topic, partition, snapshot_every=8))
        epoch = ClusterEpoch(store).current()
        out = []
        for i in range(n):
            ph = Placeholder(epoch, f"l0/000/{epoch:018d}/{ident}-{i}.l0", 8, 10, 1, i)
            try:
                offset, outcome = writer.append_placeholder(ph)
            except LogForked:  # (only with a planted create that overwrites: the log it read was rewritten)
                out.append("forked")
                break
            out.append([offset, outcome.base_offset, outcome.accepted])
        print(json.dumps(out))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
