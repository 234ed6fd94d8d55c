"""Property-based tests: the state machine against a simple model, replay equality, and
the randomized safety invariant behind I1 (no accepted, unreconciled placeholder ever
has an epoch <= M(p), nor <= any global M a GC computed)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ctp_state import layout, snapshot, state as sm
from ctp_state.entries import AccessMode, Advance, Claim, Init, Placeholder, Reconcile

PARTITIONS = 3


@dataclass
class ModelPartition:
    """The simplest statement of R2/R3/R6: a history of max applied epochs."""

    maxes: list[int]
    window_offset: int = 0
    lower_bound: int = 0
    accepted: list[tuple[int, int, int]] = field(default_factory=list)  # (log offset, epoch, records)
    reconciled_through: int = -1

    @property
    def prev(self) -> int:
        return self.maxes[-2] if len(self.maxes) > 1 else self.maxes[-1]

    def offer(self, offset: int, epoch: int, n: int) -> bool:
        if epoch < self.prev:
            return False
        if epoch > self.maxes[-1]:
            self.maxes.append(epoch)
            self.window_offset = offset
        self.accepted.append((offset, epoch, n))
        return True

    @property
    def pending(self) -> list[tuple[int, int, int]]:
        return [a for a in self.accepted if a[0] > self.reconciled_through]


class Cluster(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.c = 1
        self.logs: list[list] = []
        self.states: list[sm.PartitionState] = []
        self.models: list[ModelPartition] = []
        self.lower_bounds_seen: list[list[int]] = []
        self.global_ms: list[int] = []

    def _add(self, p: int, entry) -> sm.Outcome:
        out = sm.apply(self.states[p], len(self.logs[p]), entry)
        self.logs[p].append(entry)
        self.states[p] = out.state
        return out

    @initialize(start=st.integers(1, 5))
    def create(self, start: int) -> None:
        self.c = start
        for p in range(PARTITIONS):
            self.logs.append([])
            self.states.append(sm.PartitionState("t", p))
            self._add(p, Init(self.c))
            self._add(p, Claim(1, "reconciler", AccessMode.EXCLUSIVE, 2**62, 0))
            self.models.append(ModelPartition([self.c], lower_bound=self.c))
            self.lower_bounds_seen.append([self.c])

    @rule(step=st.integers(1, 3))
    def advance_cluster_epoch(self, step: int) -> None:
        self.c += step

    @rule(p=st.integers(0, PARTITIONS - 1), lag=st.integers(0, 4), n=st.integers(1, 3))
    def produce(self, p: int, lag: int, n: int) -> None:
        # A producer whose cached epoch is up to `lag` behind C.
        epoch = max(1, self.c - lag)
        offset = len(self.logs[p])
        out = self._add(p, Placeholder(epoch, layout.l0_key(0, epoch, "x"), 8, 10, n, 0))
        expected = self.models[p].offer(offset, epoch, n)
        assert out.accepted == expected, (epoch, self.models[p].maxes)
        if out.accepted:
            # I1 at the model level: nothing a GC may already have deleted is accepted.
            assert all(epoch > m for m in self.global_ms), (epoch, self.global_ms)

    @rule(p=st.integers(0, PARTITIONS - 1), data=st.data())
    def reconcile(self, p: int, data: st.DataObject) -> None:
        s, model = self.states[p], self.models[p]
        candidates = [s.last_reconciled_log_offset] + [x.log_offset for x in s.pending]
        through = data.draw(st.sampled_from(candidates))
        covered = [x for x in s.pending if x.log_offset <= through]
        last = covered[-1].last_offset if covered else s.last_reconciled_offset
        bound = sm.allowed_lower_bound(s, through)
        keys = (layout.l1_key(s.topic, p, s.last_reconciled_offset + 1, last),) if covered else ()
        out = self._add(p, Reconcile(through, last, keys, bound, s.fence_floor))
        assert out.accepted, out.rejected
        model.reconciled_through = through
        if model.window_offset <= through:
            model.lower_bound = max(model.lower_bound, model.prev)

    @precondition(lambda self: bool(self.states))
    @rule(p=st.integers(0, PARTITIONS - 1))
    def advance_idle(self, p: int) -> None:
        s = self.states[p]
        out = self._add(p, Advance(self.c, s.fence_floor))
        model = self.models[p]
        caught_up = not model.pending and self.c >= model.maxes[-1]
        assert out.accepted == caught_up
        if caught_up:
            model.maxes = [self.c]
            model.window_offset = len(self.logs[p]) - 1
            model.reconciled_through = len(self.logs[p]) - 1
            model.lower_bound = max(model.lower_bound, self.c)

    @rule(p=st.integers(0, PARTITIONS - 1))
    def recover_from_snapshot(self, p: int) -> None:
        restored = snapshot.decode_snapshot(snapshot.encode_snapshot(self.states[p]), "k")
        assert restored == self.states[p]
        assert restored.window == (restored.max_applied_epoch, restored.max_applied_epoch)
        self.states[p] = restored

    @rule()
    def gc(self) -> None:
        # R4: C first, then every partition; M never decreases (I3).
        m = min([self.c - 1] + [s.m for s in self.states])
        if self.global_ms:
            assert m >= self.global_ms[-1], (m, self.global_ms[-1])
        self.global_ms.append(m)

    @invariant()
    def matches_model_and_is_safe(self) -> None:
        for p, (s, model) in enumerate(zip(self.states, self.models)):
            assert s.max_applied_epoch == model.maxes[-1]
            assert s.previous_applied_epoch == model.prev
            assert s.min_epoch_lower_bound == model.lower_bound
            assert s.lag_entries == len(model.pending)
            assert s.next_offset == sum(n for _, _, n in model.accepted)
            assert s.min_epoch_lower_bound <= s.previous_applied_epoch <= s.max_applied_epoch
            # the invariant: no accepted, unreconciled placeholder has epoch <= M(p)
            assert all(x.epoch > s.m for x in s.pending)
            assert all(x.epoch > m for x in s.pending for m in self.global_ms)
            self.lower_bounds_seen[p].append(s.min_epoch_lower_bound)
            assert self.lower_bounds_seen[p] == sorted(self.lower_bounds_seen[p])  # I3

    def teardown(self) -> None:
        # Replay of each whole log equals the state folded entry by entry.
        for p, s in enumerate(self.states):
            assert sm.replay(sm.PartitionState("t", p), 0, self.logs[p]) == s


TestCluster = Cluster.TestCase


@given(
    epochs=st.lists(st.integers(1, 30), min_size=1, max_size=40),
    cut=st.integers(0, 40),
)
def test_replay_equals_entry_by_entry_apply_across_a_snapshot(epochs, cut):
    entries = [Init(epochs[0])] + [Placeholder(e, layout.l0_key(0, e, "k"), 8, 1, 1, 0) for e in epochs[1:]]
    cut = min(cut, len(entries) - 1)
    one_by_one = sm.PartitionState("t", 0)
    for i, e in enumerate(entries):
        one_by_one = sm.apply(one_by_one, i, e).state
    head = sm.replay(sm.PartitionState("t", 0), 0, entries[: cut + 1])
    restored = snapshot.decode_snapshot(snapshot.encode_snapshot(head), "k")
    assert sm.replay(restored, cut + 1, entries[cut + 1 :]) == one_by_one
