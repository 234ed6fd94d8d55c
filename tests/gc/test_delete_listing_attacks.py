"""What an adversarial review of the bounded L0 listing (each spread prefix listed up
to epoch M + 1, never into a live epoch) tried. The holes it found: a spread directory
that does not parse went unreported while it held only live epochs (the run went on to
delete other prefixes' garbage), a spread of non-ASCII digits parsed (``\\d``) and was
collected, a non-UTF-8 file name crashed the GC with an encoding error, and M at the
last epoch crashed the bound. Each failed before its fix; what held is kept too."""

from __future__ import annotations

import os

import pytest

from ctp_state import layout
from ctp_state.errors import CorruptData, StoreError
from ctp_state.gc.delete import plan_l0_deletes, scan_prefix
from ctp_state.storage import LocalStore
from ctp_state.throttle import Aimd
from ctp_state.validate import MAX_EPOCH
from tests.support import Wrapped


@pytest.mark.parametrize("spread", ["abc", "0001", "1", "00x", "\u0661\u0661\u0661"])
def test_a_spread_directory_that_does_not_parse_stops_the_run_whatever_epochs_it_holds(store, spread):
    garbage = layout.l0_key(1, 2, "a")
    store.put(garbage, b"x")
    bad = f"l0/{spread}/{9:018d}/a.l0"  # epoch 9 > M = 4: the bounded listing never reads it
    store.put(bad, b"x")
    with pytest.raises(CorruptData) as e:
        plan_l0_deletes(store, 4, now_s=0)
    assert e.value.key == bad and "does not parse" in str(e.value)
    assert store.head(garbage) is not None


def test_an_l0_key_of_non_ascii_digits_never_parses():
    for key in ("l0/\u0661\u0661\u0661/000000000000000001/a.l0", "l0/001/00000000000000000\u0661/a.l0"):
        with pytest.raises(CorruptData):
            layout.parse_l0_key(key)
    with pytest.raises(CorruptData):
        layout.parse_l1_key("l1/t/00000\u0661/00000000000000000000-00000000000000000001.parquet")


@pytest.mark.parametrize("where", ["l0/001", f"l0/001/{2:018d}"])
def test_a_file_name_that_is_not_utf8_is_named_as_corrupt_not_an_encoding_crash(tmp_path, where):
    s = LocalStore(str(tmp_path / "s"), fsync=False)
    for e in (1, 2, 9):
        s.put(layout.l0_key(1, e, "a"), b"x")
    path = os.path.join(os.fsencode(s.root), *where.encode().split(b"/"), b"bad\xff.l0")
    open(path, "wb").close()
    with pytest.raises(CorruptData) as e:
        plan_l0_deletes(s, 4, now_s=0)
    assert e.value.key == f"{where}/bad\\xff.l0" and "not valid UTF-8" in str(e.value)


def test_m_at_the_last_epoch_lists_without_a_bound(tmp_path):
    s = LocalStore(str(tmp_path / "s"), fsync=False)
    low, top = layout.l0_key(1, 1, "a"), layout.l0_key(1, MAX_EPOCH, "b")
    s.put(low, b"x")
    s.put(top, b"x")
    assert [o.key for o in plan_l0_deletes(s, MAX_EPOCH - 1, now_s=0)[0]] == [low]
    assert sorted(o.key for o in plan_l0_deletes(s, MAX_EPOCH, now_s=0)[0]) == sorted([low, top])


def test_a_listing_that_fails_part_way_resumes_within_the_bound_exactly(store):
    """start_after (where the failed listing got to) and end_before together: every
    garbage key once, nothing at or above M + 1."""
    keys = [layout.l0_key(3, e, f"k{i:03d}") for e in (1, 2, 3) for i in range(40)]
    keys += [layout.l0_key(3, e, f"live{i}") for e in (4, 5) for i in range(10)]
    for k in keys:
        store.put(k, b"x")
    failures = [25, 30, 10, 40, 3]

    class Failing(Wrapped):
        def list(self, prefix="", start_after=None, end_before=None):
            for i, info in enumerate(self.inner.list(prefix, start_after, end_before)):
                if failures and i == failures[0]:
                    failures.pop(0)
                    raise StoreError("reset", "500")
                yield info

    scan = scan_prefix(store, "l0/003/", 3, lister=Failing(store), limiter=Aimd(1), sleep=lambda s: None)
    got = [info.key for info, _ in scan.candidates]
    assert got == sorted(k for k in keys if layout.parse_l0_key(k)[1] <= 3) and scan.above == 4
    assert scan.retries == 5
