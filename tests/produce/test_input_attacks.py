"""Found by adversarial review, now guarded: input at the edge of validity in ``ctp produce``.

1. ``timestamp`` is checked as any int64 >= 0 (ctp_state/jsonl.py ``parse_record``),
   but ms past 9999-12-31 cannot be turned into a datetime: the record is acknowledged,
   then ``ctp read`` of the whole partition fails for good, on every record of it (I2:
   accepted records are readable). One bad producer line poisons the partition.
2. A header *name* is not checked at parse time (only header values are encoded);
   a lone surrogate (``"\\ud800"``, valid JSON) passes validation, then crashes the
   flush of its batch after earlier batches were acknowledged. ``ctp produce`` promises
   "bad input writes nothing" and an outcome for every record; it prints one error line,
   no outcomes, and the records of the earlier batches are in the log (I4: accepted
   records reported as a failure).
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from ctp_state.cli import framework as cli
from ctp_state.topics import create_topic
from tests.support import values


def produce(path, url, *extra):
    return CliRunner().invoke(cli.main, ["produce", str(path), "--store", url, "--json", *extra])


def test_a_far_future_timestamp_is_refused_before_anything_is_written(fstore, tmp_path):
    store = fstore
    create_topic(store, "t", 1)
    path = tmp_path / "in.jsonl"
    path.write_text(
        json.dumps({"topic": "t", "partition": 0, "value": "good"})
        + "\n"
        + json.dumps({"topic": "t", "partition": 0, "value": "edge", "timestamp": 2**62})
        + "\n"
    )
    out = produce(path, store.url)
    # Either refused at input (nothing written), or every accepted record reads back.
    if out.exit_code == 0:
        assert json.loads(out.output)["accepted"] == 2
        read = CliRunner().invoke(cli.main, ["read", "t", "0", "--store", store.url])
        assert read.exit_code == 0, f"ctp read of t/0 fails: {read.output.strip()}"
        assert [json.loads(line)["value"] for line in read.output.splitlines()] == ["good", "edge"]
    else:
        assert values(store) == [], "refused, but records were written"


def test_a_lone_surrogate_header_name_is_refused_before_anything_is_written(fstore, tmp_path):
    store = fstore
    create_topic(store, "t", 1)
    path = tmp_path / "in.jsonl"
    lines = [json.dumps({"topic": "t", "partition": 0, "value": f"v{i}"}) for i in range(3)]
    # json.dumps writes the surrogate as the escape \ud800: a valid JSON line.
    lines.append(json.dumps({"topic": "t", "partition": 0, "value": "v3", "headers": {"\ud800": "x"}}))
    path.write_text("\n".join(lines) + "\n")
    out = produce(path, store.url, "--batch-records", "2")
    written = values(store)
    if out.exit_code != 0 and "{" not in out.output:  # one error line, no outcomes
        assert written == [], f"ctp produce said {out.output.strip()!r} but wrote {written}"
    else:
        summary = json.loads(out.output[out.output.index("{") :])
        assert summary["accepted"] == len(written)
