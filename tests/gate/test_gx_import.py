"""The gate imports Great Expectations without loading scipy.stats and altair, which
none of its expectations use; code that does use them still can."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import REPO

PROBE = """
import json, sys, tempfile
from expectations.gate import GxGate
from expectations.gx_import import LAZY
from tests.support.gc import gate_frames

def loaded():
    return {m: type(sys.modules[m]).__name__ != "_LazyModule" for m in LAZY if m in sys.modules}

after_import = loaded()
ok = GxGate(tempfile.mkdtemp())(gate_frames()).success
after_gate = loaded()
import scipy.stats
p = scipy.stats.norm.cdf(0.0)  # a use loads it
print(json.dumps({"after_import": after_import, "gate_ok": ok, "after_gate": after_gate,
                  "used": loaded(), "p": p}))
"""


def test_a_gc_process_never_loads_scipy_stats_or_altair_and_they_still_load_on_use():
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    lazy = {"scipy.stats": False, "altair": False}  # imported (GX binds the names), not loaded
    assert out["after_import"] == lazy and out["gate_ok"] and out["after_gate"] == lazy
    assert out["used"]["scipy.stats"] is True and out["p"] == 0.5
