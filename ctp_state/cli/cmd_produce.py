"""``ctp produce``: records from a JSON-lines file (or generated) into a topic, each
reported accepted, duplicate, rejected, unknown or not sent; a re-run writes what is
missing and nothing twice."""

from __future__ import annotations

import sys
import time

import click

from ctp_state.cli.demo import generate as generated_batches
from ctp_state.cli.framework import (
    AT_LEAST_1,
    COUNT,
    _progress,
    command,
    emit,
    main,
)
from ctp_state.codec import JsonObject
from ctp_state.errors import CtpError
from ctp_state.l0 import Record
from ctp_state.storage import ObjectStore

# --- produce ---


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True), required=False)
@click.option("--generate", is_flag=True, help="Produce synthetic records instead of reading FILE.")
@click.option("--topic", "topic_name", help="Topic for --generate.")
@click.option("--records", type=COUNT, default=10_000, show_default=True, help="Records to generate.")
@click.option("--value-size", type=COUNT, default=100, show_default=True, help="Bytes per generated value.")
@click.option(
    "--batch-records", type=AT_LEAST_1, default=5_000, show_default=True, help="Records per flush (one L0 object each)."
)
@click.option("--seed", type=int, default=None, help="Seed for --generate (repeatable data).")
@click.option(
    "--producer-id",
    default=None,
    help="A name for the producer. For FILE the id is this name plus a digest of FILE's bytes (default: "
    "the digest alone), so running the same command again never duplicates and the same name with "
    "other bytes is another producer; to write a file twice on purpose, give a new name. For "
    "--generate the id itself (default: a fresh one).",
)
@click.option(
    "--replay-limit",
    type=COUNT,
    default=200_000,
    show_default=True,
    help="A partition that forgot this producer id and holds one of its entries that the progress record "
    "cannot settle is replayed from its first entry if that entry's offset is at most this; beyond, its "
    "records are reported unknown with the offset.",
)
@command(store="flag")
def produce(
    store: ObjectStore,
    as_json: bool,
    file: str | None,
    generate: bool,
    topic_name: str | None,
    records: int,
    value_size: int,
    batch_records: int,
    seed: int | None,
    producer_id: str | None,
    replay_limit: int,
) -> None:
    """Produce records from a JSON-lines FILE ('-' for stdin) or with --generate.

    Each line: {"topic": ..., "partition": N, "value": "text" | "value_b64": "...",
    "key"/"key_b64", "headers": {"name": "text"}, "timestamp": ms}.

    Every record ends accepted (written now), a duplicate (written before, by an earlier
    run with the same producer id), rejected (not written), unknown (the store did not
    say; it may be written) or not sent (an earlier batch of its partition was not
    accepted). Exit 1 if any was rejected, else 3 if any outcome is unknown: running
    the same command again then writes what is missing and nothing twice.
    """
    from ctp_state.ingest import ProduceReport, input_producer_id, produce_input, send_batches
    from ctp_state.producer import Producer

    if generate == (file is not None):
        raise click.UsageError("give either FILE or --generate")
    if batch_records < 1:
        raise click.UsageError("--batch-records must be >= 1")
    started = time.monotonic()
    with _progress() as progress:
        task = progress.add_task("producing", total=records if generate else None)
        advance = lambda n: progress.advance(task, n)  # noqa: E731
        if generate:
            from ctp_state.topics import get_topic

            # Bound to the incarnation it starts with, as a FILE run is (ingest.produce_input).
            bound = [get_topic(store, topic_name)] if topic_name else []
            with Producer(store, producer_id=producer_id, topics=bound) as producer:
                report = ProduceReport(producer.producer_id)
                send_batches(
                    producer,
                    generated_batches(store, topic_name, records, value_size, batch_records, seed),
                    report,
                    records,
                    advance,
                )
        else:
            parsed, digest = _read_input(store, file)  # type: ignore[arg-type]
            progress.update(task, total=len(parsed))
            report = produce_input(
                store,
                parsed,
                producer_id=input_producer_id(digest, producer_id),
                digest=digest,
                batch_records=batch_records,
                on_progress=advance,
                replay_limit=replay_limit,
            )
    seconds = time.monotonic() - started
    total = report.accepted + report.duplicates + report.rejected + report.unknown + report.not_sent
    summary = {
        **report.as_dict(),
        "seconds": round(seconds, 3),
        "records_per_second": round(total / max(seconds, 1e-9)),
    }
    if report.completed_before is not None:
        text = (
            f"already written: producer id {report.producer_id} completed this input before "
            f"({report.completed_before.records} records); nothing written"
        )
    else:
        text = (
            f"accepted {report.accepted} records"
            + (f", {report.duplicates} already written (not written twice)" if report.duplicates else "")
            + f", rejected {report.rejected}"
            + (f", unknown {report.unknown}" if report.unknown else "")
            + (f", not sent {report.not_sent}" if report.not_sent else "")
            + f" in {seconds:.1f}s"
            + (
                f" ({dict(report.rejected_by_reason)}; first: {report.first_error})"
                if report.rejected or report.unknown
                else ""
            )
        )
        for d in report.in_doubt:
            text += (
                f"\n{d.topic}/{d.partition} no longer remembers producer {report.producer_id}: records "
                f"{d.first_seq}-{d.last_seq} of its sequence may be in the log (entry {d.log_offset}); "
                f"run again with --replay-limit {d.log_offset} or more to settle it by reading the partition's "
                "log from its first entry"
            )
        if (report.unknown or report.not_sent) and not report.in_doubt:
            text += (
                "\nsome outcomes are unknown or records were not sent: run the same command again "
                f"(producer id {report.producer_id}); records already written are recognised and not written twice"
            )
    emit(as_json, summary, text)
    if report.rejected:
        sys.exit(1)
    if report.unknown or report.not_sent:
        sys.exit(3)


def _read_input(store: ObjectStore, file: str) -> tuple[list[tuple[str, int, Record]], str]:
    """Read and validate the whole input (bad input writes nothing); return the records
    and the input's SHA-256."""
    import io

    from ctp_state.errors import InvalidRecord
    from ctp_state.ingest import input_digest
    from ctp_state.jsonl import read_records
    from ctp_state.topics import get_topic

    name = "<stdin>" if file == "-" else file
    try:
        with click.open_file(file, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CtpError(f"{name}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise InvalidRecord(f"{name}:{line}", f"not UTF-8 (byte {e.start} of the file)") from None
    parsed = list(read_records(io.StringIO(text), name))
    topics: JsonObject = {}
    for i, (t, p, _) in enumerate(parsed):
        try:
            if t not in topics:
                topics[t] = get_topic(store, t)
            topics[t].check_partition(p)
        except CtpError as e:
            raise CtpError(f"{name}: record {i + 1}: {e}") from None
    return parsed, input_digest(raw)
