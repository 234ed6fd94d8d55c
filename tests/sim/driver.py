"""Run a schedule against a real store with real processes, then quiesce and check.

Each actor is a process (a long-lived worker, see :mod:`tests.sim.worker`, or one
``ctp``/``spark-submit`` run per step). Steps start in schedule order; a step waits
only for its own actor's previous step, so up to one step per actor runs at once and
the interleaving comes from real concurrency. Kills are real SIGKILLs of the actor's
process group; crash points are the product's own (``CTP_FAULT``); on S3 every request
goes through the fault proxy, which arms the step's fault rule when the step starts.

After the last step the run quiesces (faults off, producers settle what they were left
unsure of, CLI runs that did not finish are run again, then advance + reconcile + GC
until nothing is pending and no L0 object is left) and checks the invariants; see
:meth:`Sim.check`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ctp_state import layout
from ctp_state.errors import CtpError
from ctp_state.gc.history import GcHistory
from ctp_state.incarnations import set_retention
from ctp_state.storage import LocalStore, ObjectStore, open_store
from ctp_state.topics import create_topic
from tests.sim.model import (
    ACTORS,
    PRODUCERS,
    RETENTION_BYTES,
    TOPIC,
    Ledger,
    Params,
    Step,
    check_history_monotonic,
    check_read,
    records,
    to_jsonl,
)
from tests.support import plog

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOKS_DIR = os.path.join(REPO, "tests", "hooks")  # crash points and planted bugs (sitecustomize)
STEP_TIMEOUT_S = 180.0
#: Partitions of the sim's topic that no step writes to.
QUIET_PARTITIONS = 8


@dataclass
class SimReport:
    seed: int
    backend: str
    steps: int = 0
    kills: int = 0  # SIGKILLs that hit a running step
    crashes: Counter[str] = field(default_factory=Counter)  # crash points reached
    faults: Counter[str] = field(default_factory=Counter)  # S3 faults the proxy injected
    records: Counter[str] = field(default_factory=Counter)  # accepted / unknown / rejected
    errors: Counter[str] = field(default_factory=Counter)  # steps that ended in an error, by op
    completed: Counter[str] = field(default_factory=Counter)  # steps that ran to their end without error, by op
    #: paused steps that ran to their end, by op, with how many steps started during their pause
    paused: Counter[str] = field(default_factory=Counter)
    overlapped: Counter[str] = field(default_factory=Counter)
    quiesce_rounds: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    replay: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "backend": self.backend,
            "steps": self.steps,
            "kills": self.kills,
            "crash_points": dict(self.crashes),
            "faults": dict(self.faults),
            "records": dict(self.records),
            "step_errors": dict(self.errors),
            "completed": dict(self.completed),
            "paused": dict(self.paused),
            "overlapped": dict(self.overlapped),
            "quiesce_rounds": self.quiesce_rounds,
            "violations": len(self.violations),
            "seconds": round(self.seconds, 1),
            "replay": self.replay,
        }

    def text(self) -> str:
        d = self.as_dict()
        head = (
            f"sim seed={self.seed} {self.backend}: {self.steps} steps, {self.kills} kills, "
            f"{sum(self.crashes.values())} crash points, {sum(self.faults.values())} S3 faults, "
            f"records {dict(self.records)}, {len(self.violations)} violations in {d['seconds']}s"
        )
        if not self.violations:
            return head
        lines = [head] + [f"  violation: {v}" for v in self.violations[:30]]
        lines.append(f"  replay: python -m tests.sim.soak --backend {self.backend} --replay {self.replay}")
        return "\n".join(lines)


def _kill_group(proc: subprocess.Popen) -> bool:
    if proc.poll() is not None:
        return False
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


class Actor:
    """One actor: at most one step in flight."""

    def __init__(self, sim: Sim, name: str):
        self.sim, self.name = sim, name
        self.thread: threading.Thread | None = None
        self.proc: subprocess.Popen | None = None
        self.step: Step | None = None
        self.killed = False
        self.last: dict[str, Any] | None = None  # the reply to the last step

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def wait(self, timeout: float = STEP_TIMEOUT_S) -> None:
        if self.thread is None:
            return
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.sim.violation(
                f"step {self.step.n if self.step else '?'} ({self.name}) did not finish in {timeout:.0f}s; killed"
            )
            self.kill()
            self.thread.join(30)

    def kill(self) -> bool:
        proc = self.proc
        if proc is not None and _kill_group(proc):
            self.killed = True
            return True
        return False

    def start(self, step: Step) -> None:
        self.step, self.killed = step, False
        self.thread = threading.Thread(target=self._run, args=(step,), name=f"sim-{self.name}", daemon=True)
        self.thread.start()

    def _run(self, step: Step) -> None:
        try:
            reply, rc = self.run(step)
        except Exception as e:  # the driver's own failure: report it, do not hang the run
            reply, rc = {"driver_error": f"{type(e).__name__}: {e}"}, None
        self.last = reply
        self.sim.finished(self, step, reply, rc)

    def run(self, step: Step) -> tuple[dict[str, Any] | None, int | None]:
        raise NotImplementedError


class WorkerActor(Actor):
    kind = "api"

    def __init__(self, sim: Sim, name: str, kind: str):
        super().__init__(sim, name)
        self.kind = kind

    def _ensure(self) -> subprocess.Popen | None:
        """The worker process, started if need be; None if it died starting (a kill)."""
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        log = open(os.path.join(self.sim.workdir, f"{self.name}.log"), "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.sim.worker",
                self.sim.url,
                str(self.sim.seed),
                self.kind,
                self.sim.report_dir,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=self.sim.env,
            cwd=REPO,
            start_new_session=True,
            text=True,
            bufsize=1,
        )
        log.close()
        ready = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not ready:
            if self.proc.wait() < 0:
                return None  # killed while starting
            raise RuntimeError(f"worker {self.name} did not start (see {self.sim.workdir}/{self.name}.log)")
        return self.proc

    def run(self, step: Step) -> tuple[dict[str, Any] | None, int | None]:
        proc = self._ensure()
        if proc is None:
            return None, self.proc.returncode  # type: ignore[union-attr]
        try:
            proc.stdin.write(
                json.dumps(
                    {
                        "n": step.n,
                        "op": step.op,
                        "args": step.args,  # type: ignore[union-attr]
                        "crash": step.crash,
                    }
                )
                + "\n"
            )
            proc.stdin.flush()  # type: ignore[union-attr]
            line = proc.stdout.readline()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            line = ""
        if line:
            return json.loads(line), None
        proc.wait()
        return None, proc.returncode


class OneShotActor(Actor):
    """A process per step: ``ctp produce``, ``ctp read``, ``ctp epoch advance``, spark-submit."""

    def run(self, step: Step) -> tuple[dict[str, Any] | None, int | None]:
        argv, stdin = self.sim.command(step)
        env = dict(self.sim.env)
        if step.crash:
            env["CTP_FAULT"] = step.crash
        if step.pause:
            env["CTP_PAUSE"] = step.pause
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=self.sim.workdir,
            start_new_session=True,
            text=True,
        )
        out, err = self.proc.communicate(stdin)
        return {"stdout": out, "stderr": err[-2000:]}, self.proc.returncode


class Sim:
    def __init__(
        self,
        url: str,
        env: dict[str, str],
        seed: int,
        *,
        backend: str,
        proxy: Any = None,
        plant: str | None = None,
        workdir: str | None = None,
    ):
        self.url, self.seed, self.proxy = url, seed, proxy
        self.workdir = workdir or tempfile.mkdtemp(prefix=f"ctp-sim-{seed}-")
        os.makedirs(self.workdir, exist_ok=True)
        self.report_dir = os.path.join(self.workdir, "report")
        path = [REPO, HOOKS_DIR]
        self.env = {
            **os.environ,
            **env,
            "CTP_STORE": url,
            # the topic's Iceberg table (ctp table publish): a catalog of the run's own
            "CTP_CATALOG_URI": "sqlite:///" + os.path.join(self.workdir, "catalog.db"),
            "PYTHONPATH": os.pathsep.join(path + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        }
        self.env.pop("CTP_FAULT", None)
        if plant:
            self.env["CTP_SIM_PLANT"] = plant
        self.plant = plant
        self.store: ObjectStore = open_store(url, env)
        self.ledger = Ledger(seed)
        self.report = SimReport(seed, backend)
        self.lock = threading.Lock()
        self.actors: dict[str, Actor] = {}
        for name in ACTORS:
            if name in PRODUCERS:
                self.actors[name] = WorkerActor(self, name, "stale" if name == "stale" else "api")
            elif name in ("advancer", "reconciler0", "reconciler1", "gc", "reader"):
                self.actors[name] = WorkerActor(self, name, "other")
            else:
                self.actors[name] = OneShotActor(self, name)
        self.cli_done: dict[int, bool] = {}  # CLI input (batch) -> some run of it exited 0
        self.cli_parts: dict[int, list[list[int]]] = {}
        # read step -> records acknowledged before it, as (incarnation, batch, partition, j)
        self.acked: dict[int, set[tuple[str | None, int, int, int]]] = {}
        self.read_incarnation: dict[int, str | None] = {}  # ctp read step -> the incarnation before it
        self.quiesce_log: list[dict[str, Any]] = []
        self.started = 0

    # --- bookkeeping (called from actor threads) -------------------------------------------

    def violation(self, what: str) -> None:
        with self.lock:
            self.report.violations.append(what)

    def finished(self, actor: Actor, step: Step, reply: dict[str, Any] | None, rc: int | None) -> None:
        with self.lock:
            self._finished(actor, step, reply, rc)

    def _finished(self, actor: Actor, step: Step, reply: dict[str, Any] | None, rc: int | None) -> None:
        rep, led = self.report, self.ledger
        died = reply is None or (rc is not None and rc < 0)
        if died and step.crash and not actor.killed:
            rep.crashes[step.crash.split(":")[0]] += 1
        if reply and "crashed" in reply:
            rep.violations.append(f"step {step.n} ({step.op}): uncaught {reply['crashed']}\n{reply.get('traceback')}")
        if reply and "driver_error" in reply:
            rep.violations.append(f"step {step.n} ({step.op}): driver: {reply['driver_error']}")
        if reply and "error" in reply:
            rep.errors[step.op] += 1
        ok = (
            not died
            and reply is not None
            and not ({"error", "crashed", "driver_error", "gate_failed"} & set(reply))
            and rc in (0, None)
        )
        if ok and step.n >= 0:
            rep.completed[step.op] += 1
        if step.pause and not died:
            rep.paused[step.op] += 1
            rep.overlapped[step.op] += self.started - step.n - 1  # steps begun while it ran
        if step.n < 0:
            self.quiesce_log.append(
                {"op": step.op, "reply": {k: v for k, v in (reply or {}).items() if k != "rows"}, "rc": rc}
            )
        if step.op in ("produce", "resend"):
            answered = set()
            for batch, p, answer in (reply or {}).get("told", []):
                led.told(batch, p, answer)
                answered.add((batch, p))
            if step.op == "produce":
                for p, _n in step.args["parts"]:
                    if (step.args["batch"], p) not in answered:
                        led.unknown(step.args["batch"], p, "the producer died before it was told")
        elif step.op in ("produce_cli", "rerun_cli"):
            self._cli_told(step, reply, rc)
        elif step.op == "read" and reply and "rows" in reply:
            # A read that a delete or re-create overlapped is of no one incarnation: not checked.
            rows = [(o, _u(v), _u(k), ts, tuple((h, _u(hv)) for h, hv in hs)) for o, v, k, ts, hs in reply["rows"]]
            self._check_mid_run_read(step, rows, reply.get("incarnation"), "read")
        elif step.op == "read_cli" and not died and reply is not None:
            inc = self.read_incarnation.pop(step.n, None)
            if rc == 0:
                rows = [_cli_row(json.loads(x)) for x in reply["stdout"].splitlines() if x.strip()]
                self._check_mid_run_read(step, rows, inc if inc == self._incarnation() else None, "ctp read")
            else:
                rep.errors[step.op] += 1
        elif (
            step.op in ("delete_cli", "create_cli", "publish_cli", "compact_cli", "retention_cli", "delete_records_cli")
            and rc not in (0, None)
            and not died
        ):
            rep.errors[step.op] += 1
        elif step.op == "gc" and reply and "gate_failed" in reply:
            rep.violations.append(
                f"step {step.n} (gc): the gate refused a store nothing corrupted: {reply['gate_failed']}"
            )
        elif step.op in ("reconcile_spark", "advance_cli") and rc not in (0, None) and not died:
            rep.errors[step.op] += 1

    def _check_mid_run_read(self, step: Step, rows: list[Any], inc: str | None, what: str) -> None:
        """Check a read of incarnation ``inc`` against what was acknowledged before it
        (None: a delete or re-create overlapped it; it is of no one incarnation)."""
        acked = self._acked(step.n, inc)
        if inc is None:
            return
        try:  # the start offset now: at or after where the read began (it only grows)
            start = plog(self.store, TOPIC, step.args["partition"]).read_state().start_offset
        except CtpError:
            return  # (the topic was deleted meanwhile: the read is of no one incarnation now)
        for v in check_read(
            self.ledger,
            step.args["partition"],
            rows,
            final=False,
            acknowledged_before=acked,
            incarnation=inc,
            start=start,
        ):
            self.report.violations.append(f"step {step.n} ({what}): {v}")

    def _cli_told(self, step: Step, reply: dict[str, Any] | None, rc: int | None) -> None:
        batch = step.args["batch"]
        parts = self.cli_parts[batch]
        summary: dict[str, Any] = {}
        if reply is not None and rc is not None and rc >= 0:
            with contextlib.suppress(ValueError):
                summary = json.loads(reply["stdout"].strip().splitlines()[-1]) if reply["stdout"].strip() else {}
        total = sum(n for _, n in parts)
        if rc == 0:
            self.cli_done[batch] = True
            answer = {
                "outcome": "accepted",
                "via": "ctp produce exit 0",
                "incarnation": (summary.get("topics") or {}).get(TOPIC),
            }
        elif (
            summary
            and not (summary.get("accepted") or summary.get("duplicates") or summary.get("unknown"))
            and summary.get("rejected", 0) + summary.get("not_sent", 0) == total
        ):
            answer = {"outcome": "rejected", "via": f"ctp produce exit {rc}, nothing written"}
        else:
            answer = {"outcome": "unknown", "via": f"ctp produce exit {rc}"}
        if rc not in (0, None) and rc >= 0:
            self.report.errors[step.op] += 1
        for p, _ in parts:
            self.ledger.told(batch, p, answer)

    # --- steps ------------------------------------------------------------------------------

    def command(self, step: Step) -> tuple[list[str], str | None]:
        ctp = [sys.executable, "-m", "ctp_state.cli"]
        if step.op in ("produce_cli", "rerun_cli"):
            batch = step.args["batch"]
            path = os.path.join(self.workdir, f"input-{batch}.jsonl")
            return ctp + ["produce", path, "--json", "--batch-records", str(step.args.get("batch_records", 5000))], None
        if step.op == "advance_cli":
            return ctp + ["epoch", "advance"], None
        if step.op == "read_cli":
            return ctp + ["read", TOPIC, str(step.args["partition"])], None
        if step.op == "delete_cli":
            return ctp + ["topic", "delete", TOPIC, "--json"], None
        if step.op == "create_cli":
            return ctp + [
                "topic",
                "create",
                TOPIC,
                "--partitions",
                str(self.partitions),
                "--exist-ok",
                "--retention-bytes",
                str(RETENTION_BYTES),
                "--json",
            ], None
        if step.op == "publish_cli":
            return ctp + ["table", "publish", "--json"], None
        if step.op == "compact_cli":  # (short leases: a killed run's claim lapses within the quiesce)
            return ctp + ["compact", "--max-small-files", "1", "--target-file-mb", "1", "--lease-seconds", "5"], None
        if step.op == "retention_cli":
            return ctp + ["retention", "--lease-seconds", "5", "--json"], None
        if step.op == "delete_records_cli":
            a = step.args
            return ctp + ["delete-records", TOPIC, str(a["partition"]), str(a["offset"]), "--lease-seconds", "5"], None
        if step.op == "reconcile_spark":
            exe = shutil.which("spark-submit") or os.path.join(os.path.dirname(sys.executable), "spark-submit")
            return [
                exe,
                "--master",
                "local[2]",
                "--conf",
                "spark.ui.enabled=false",
                os.path.join(REPO, "spark_apps", "reconcile.py"),
                "--idle-lag",
                "1",
                "--lease-seconds",
                "5",
                "--target-file-mb",
                "0.001",
            ], None
        raise ValueError(step.op)

    def begin(self, step: Step) -> None:
        """Prepare what the step needs before it starts (ledger entries, input files)."""
        with self.lock:
            self._begin(step)

    def _begin(self, step: Step) -> None:
        if step.op == "produce":
            for p, n in step.args["parts"]:
                self.ledger.sent(step.args["batch"], p, n)
        elif step.op == "produce_cli":
            batch = step.args["batch"]
            self.cli_parts[batch] = step.args["parts"]
            text = ""
            for p, n in step.args["parts"]:
                text += to_jsonl(self.ledger.sent(batch, p, n).records, p)
            with open(os.path.join(self.workdir, f"input-{batch}.jsonl"), "w") as f:
                f.write(text)
        elif step.op in ("read", "read_cli"):
            self.acked[step.n] = {
                (inc, c.batch, c.partition, j) for c in self.ledger.chunks.values() for inc, j in c.offsets
            }
            if step.op == "read_cli":
                self.read_incarnation[step.n] = self._incarnation()

    def run_step(self, step: Step) -> None:
        actor = self.actors[step.actor]
        actor.wait()
        self.begin(step)
        if step.fault and self.proxy is not None:
            f = step.fault
            self.proxy.add_rule(
                f["kind"],
                key_regex=f.get("key_regex"),
                times=f.get("times"),
                delay_s=f.get("delay_s", 0.0),
                method="POST" if f["kind"] == "delete_key_errors" else None,
            )
        actor.start(step)
        self.started = step.n + 1  # (the steps begun so far: a paused step counts those after it)
        if step.kill_after_ms is not None:

            def kill(a: Actor = actor, s: Step = step) -> None:
                if a.step is s and a.busy() and a.kill():
                    with self.lock:
                        self.report.kills += 1

            t = threading.Timer(step.kill_after_ms / 1000, kill)
            t.daemon = True
            t.start()
        self.report.steps += 1
        time.sleep(step.gap_ms / 1000)

    def run(self, steps: list[Step], *, replay_path: str | None = None) -> SimReport:
        started = time.monotonic()
        written = max(max((p for s in steps for p, _ in s.args.get("parts", [])), default=0) + 1, 3)
        # and partitions nobody writes to: the reconciler's quiet path (not read, ticked
        # from the GC's pack; docs/design.md 14) runs beside the busy ones
        self.partitions = written + QUIET_PARTITIONS
        create_topic(self.store, TOPIC, self.partitions, exist_ok=True)
        set_retention(self.store, TOPIC, None, RETENTION_BYTES)
        try:
            for step in steps:
                self.run_step(step)
            for a in self.actors.values():
                a.wait()
            if self.proxy is not None:
                # Faults off for the quiesce, but for per-key delete errors not fired yet:
                # the quiesce's GC deletes, so every kind fires in every S3 run.
                self.proxy.clear_rules(keep=lambda r: r.kind == "delete_key_errors" and r.fired < (r.times or 1))
            with planted(self.plant):  # the driver's own reads see the state as every process does
                self.quiesce()
                if self.proxy is not None:
                    self.proxy.clear_rules()
                    self.report.faults.update(self.proxy.injected)
                self.check()
        finally:
            self.close()
        self.report.records = self.ledger.counts()
        self.report.seconds = time.monotonic() - started
        if self.report.violations:
            path = replay_path or os.path.join(self.workdir, "replay.jsonl")
            with open(path, "w") as f:
                f.write(json.dumps({"seed": self.seed, "plant": self.plant}) + "\n")
                for s in steps:
                    f.write(s.to_json() + "\n")
            self.report.replay = path
        return self.report

    def close(self) -> None:
        for a in self.actors.values():
            a.kill()
            if isinstance(a, WorkerActor) and a.proc is not None:
                with contextlib.suppress(Exception):
                    a.proc.wait(10)
                for stream in (a.proc.stdin, a.proc.stdout):
                    with contextlib.suppress(Exception):
                        stream.close()  # type: ignore[union-attr]

    # --- quiesce and check -------------------------------------------------------------------

    def _do(self, actor: str, op: str, **args: Any) -> dict[str, Any] | None:
        step = Step(-1, actor, op, args)
        a = self.actors[actor]
        a.wait()
        self.begin(step)
        a.start(step)
        a.wait()
        return a.last

    def quiesce(self, rounds: int = 8) -> None:
        """Settle what producers were left unsure of, then advance + reconcile + GC until
        nothing is pending and no L0 object is left."""
        self._do("cli", "create_cli")  # a topic left deleted gets a live incarnation to check
        for name in PRODUCERS:
            self._do(name, "resend")
        for batch in sorted(self.cli_parts):
            if not self.cli_done.get(batch):
                self._do("cli", "rerun_cli", batch=batch)
        for r in range(1, rounds + 1):
            self.report.quiesce_rounds = r
            self._do("advancer", "advance")
            # claim_wait_s: a claim a killed reconciler left is waited out (leases are short here)
            self._do("reconciler0", "reconcile", lease_ms=60_000, target_file_bytes=1 << 20, claim_wait_s=15.0)
            # (the table follows compactions and trims, so that the GC may delete what they replaced)
            self._do("cli", "publish_cli")
            self._do("gc", "gc", l1_grace_s=0.0, max_deletes=None, full=True)
            if (
                not self._pending()
                and not list(self.store.list(layout.L0_ROOT))
                and not self._l1_orphans()
                and not self._deleted_left()
            ):
                return
            time.sleep(1.0)
        self.violation(
            f"the store did not quiesce in {rounds} rounds: pending {self._pending()}, "
            f"{len(list(self.store.list(layout.L0_ROOT)))} L0 objects, L1 orphans {self._l1_orphans()[:5]}, "
            f"deleted topic state {self._deleted_left()[:5]}; "
            f"last steps: {json.dumps(self.quiesce_log[-3:])[:1500]}"
        )

    def _incarnation(self) -> str | None:
        """The live incarnation's id (None while the topic is deleted)."""
        from ctp_state.errors import TopicNotFound
        from ctp_state.topics import get_topic

        try:
            return get_topic(self.store, TOPIC).id
        except TopicNotFound:
            return None

    def _acked(self, n: int, incarnation: str | None) -> set[tuple[int, int, int]]:
        return {(b, p, j) for inc, b, p, j in self.acked.pop(n, set()) if inc == incarnation}

    def _deleted_left(self) -> list[str]:
        """Deleted incarnations still listed as deleting, and keys left in a removed one's space."""
        from ctp_state.deletion import REMOVAL_ORDER, state_keys
        from ctp_state.incarnations import read_name

        st = read_name(self.store, TOPIC)
        out = [f"incarnation {t.incarnation} still deleting" for t, _ in st.deleting]
        for t in st.removed:
            for root in REMOVAL_ORDER:
                out += [f"{i.key} (of removed incarnation {t.incarnation})" for i in state_keys(self.store, t, root)]
        return out

    def _pending(self) -> dict[int, int | str]:

        out = {}
        for p in range(self._partitions()):
            try:
                st = plog(self.store, TOPIC, p).read_state()
            except CtpError as e:
                out[p] = f"unreadable: {e}"
                continue
            if st.pending:
                out[p] = len(st.pending)
        return out

    def _partitions(self) -> int:
        from ctp_state.topics import get_topic

        return get_topic(self.store, TOPIC).partitions

    def _l1_orphans(self) -> list[str]:
        from ctp_state.topics import get_topic

        out = []
        for p in range(self._partitions()):
            try:
                committed = set(plog(self.store, TOPIC, p).read_state().committed_l1_keys())
            except CtpError as e:
                out.append(f"p{p}: state unreadable: {e}")
                continue
            prefix = layout.l1_partition_prefix(TOPIC, p, get_topic(self.store, TOPIC).key_id)
            out += [i.key for i in self.store.list(prefix) if i.key not in committed]
        return out

    def check(self) -> None:
        """The end checks: every accepted record readable exactly once, byte-identical,
        offsets contiguous; no rejected record readable; an unknown one at most once; M
        never decreased; every state log dense and decodable (``verify --deep``); no
        pending placeholder at or below M, nor one whose L0 object is gone; no orphan."""
        from ctp_state.read import read_partition
        from ctp_state.verify import verify

        for p in range(self._partitions()):
            try:
                table = read_partition(self.store, TOPIC, p)
            except Exception as e:
                self.violation(f"p{p}: read fails after quiesce: {type(e).__name__}: {e}")
                continue
            rows = _table_rows(table)
            start = plog(self.store, TOPIC, p).read_state().start_offset
            for v in check_read(self.ledger, p, rows, final=True, incarnation=self._incarnation(), start=start):
                self.violation(f"final: {v}")
        history = list(GcHistory(self.store).records())
        for v in check_history_monotonic(history):
            self.violation(v)
        report = verify(self.store, deep=True)
        for f in report.errors:
            self.violation(f"verify --deep: {f.where}: {f.what}" + (f" ({f.key})" if f.key else ""))
        passed = [r.m for r in history if r.status in ("ok", "partial") and r.m is not None]
        m = max(passed, default=None)
        for p in range(self._partitions()):
            try:
                st = plog(self.store, TOPIC, p).read_state()
            except CtpError as e:
                self.violation(f"p{p}: state does not read after quiesce: {e}")
                continue
            for ph in st.pending:
                if m is not None and ph.epoch <= m:
                    self.violation(
                        f"p{p}: pending placeholder at log offset {ph.log_offset} has epoch {ph.epoch} <= M {m}"
                    )
                if self.store.head(ph.l0_key) is None:
                    self.violation(f"p{p}: pending placeholder's L0 object {ph.l0_key} is gone")
        left = [i.key for i in self.store.list(layout.L0_ROOT)]
        if left:
            self.violation(f"{len(left)} L0 objects left after quiesce (first {left[0]})")
        self._check_table()

    def _check_table_head(self) -> None:
        """Before the final publish (which repairs a damaged head): the table's head names
        only files that are there -- its published vector and its manifests (a publish
        paused across a GC sweep must not have been robbed of them)."""
        from pyiceberg.exceptions import NoSuchTableError

        from ctp_state.table.catalog import CatalogConfig, open_catalog
        from ctp_state.table.files import data_files, published_vector

        config = CatalogConfig(uri=self.env["CTP_CATALOG_URI"])
        try:
            table = open_catalog(self.store, config, home=self.workdir).load_table(("ctp", TOPIC))
        except NoSuchTableError:
            return
        except Exception as e:
            self.violation(f"the table does not load: {type(e).__name__}: {e}")
            return
        try:
            published_vector(self.store, table)
            data_files(table)
        except Exception as e:
            self.violation(f"the table's head names a file that is gone: {type(e).__name__}: {e}")

    def _check_table(self) -> None:
        """One publish after the quiesce; the table then holds exactly the committed L1
        files of the live incarnation, each once, and reads back every committed record."""
        self._check_table_head()
        reply = self._do("cli", "publish_cli")
        if self.quiesce_log[-1]["rc"] != 0:
            self.violation(f"the final ctp table publish failed: {json.dumps(reply)[:1500]}")
            return
        from ctp_state.table.catalog import CatalogConfig, open_catalog
        from ctp_state.table.files import data_files

        config = CatalogConfig(uri=self.env["CTP_CATALOG_URI"])
        table = open_catalog(self.store, config, home=self.workdir).load_table(("ctp", TOPIC))
        paths = [f.path for f in data_files(table)]
        if len(paths) != len(set(paths)):
            self.violation(f"table: {len(paths) - len(set(paths))} files appended twice")
        want, records = set(), 0
        for p in range(self._partitions()):
            st = plog(self.store, TOPIC, p).read_state()
            for ref in st.committed_l1_files():
                want.add(f"{self.store.url.rstrip('/')}/{ref.key}")
                records += ref.last - ref.first + 1
        got = {p for p in paths if "/copies/" not in p}
        if got != want:
            self.violation(
                f"table files differ from the committed L1 files: extra {sorted(got - want)[:3]}, "
                f"missing {sorted(want - got)[:3]}"
            )
        rows = table.scan().to_arrow().num_rows
        if rows != records:
            self.violation(f"table reads {rows} records, the logs commit {records}")
        for key in self._l1_orphans():
            self.violation(f"L1 orphan left after quiesce: {key}")
        for what in self._deleted_left():
            self.violation(f"deleted topic state left after quiesce: {what}")
        if isinstance(self.store, LocalStore):
            tmp = os.path.join(self.store.root, ".ctp-tmp")
            leftovers = os.listdir(tmp) if os.path.isdir(tmp) else []
            if leftovers:
                self.violation(f"{len(leftovers)} temporary files left in {tmp} after quiesce")


@contextlib.contextmanager
def planted(plant: str | None) -> Iterator[None]:
    """The planted bug in this process too, for the end checks' own reads."""
    if plant != "lower_bound_plus_one":
        yield
        return
    from ctp_state import state as sm

    orig = sm.allowed_lower_bound
    sm.allowed_lower_bound = lambda s, through: orig(s, through) + 1  # type: ignore[assignment]
    try:
        yield
    finally:
        sm.allowed_lower_bound = orig  # type: ignore[assignment]


def _u(v: str | None) -> bytes | None:
    return None if v is None else base64.b64decode(v)


def _cli_row(d: dict[str, Any]) -> tuple[int, bytes, bytes | None, int, tuple[tuple[str, bytes], ...]]:
    """A line of ``ctp read``, parsed as ``ctp produce`` input (the two round-trip)."""
    from ctp_state.jsonl import parse_record

    _, _, r = parse_record(d, "ctp read output")
    return (d["offset"], r.value, r.key, r.timestamp_ms, r.headers)


def _table_rows(table: Any) -> list[tuple[int, bytes, bytes | None, int, tuple[tuple[str, bytes], ...]]]:
    import pyarrow as pa

    ms = table.column("timestamp").cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()
    return [
        (r["offset"], r["value"], r["key"], ts, tuple((h["key"], h["value"]) for h in r["headers"] or []))
        for r, ts in zip(table.drop_columns(["timestamp"]).to_pylist(), ms)
    ]


def run_sim(
    seed: int,
    params: Params,
    *,
    backend: str,
    url: str,
    env: dict[str, str],
    proxy: Any = None,
    plant: str | None = None,
    steps: list[Step] | None = None,
    workdir: str | None = None,
) -> SimReport:
    from tests.sim.model import schedule

    sim = Sim(url, env, seed, backend=backend, proxy=proxy, plant=plant, workdir=workdir)
    return sim.run(steps if steps is not None else schedule(seed, params))


__all__ = ["Sim", "SimReport", "records", "run_sim"]
