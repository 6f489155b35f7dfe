"""The dead-letter view (pure): the DLQ's recent records, newest first, with a safe preview."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from daemon.dlq_marks import ReplayMark, mark_of
from daemon.explore.dlq import DeadLetter
from daemon.explore.html import esc, table

_COLUMNS = (
    "reason",
    "topic / partition / offset",
    "tenant",
    "failed at",
    "attempts",
    "original",
    "DLQ at",
    "sent again",
)


def dlq_body(
    records: Sequence[DeadLetter],
    *,
    topic: str,
    limit: int,
    error: str | None = None,
    hidden: int = 0,
    marks: Mapping[str, ReplayMark] | None = None,
) -> str:
    """The records as a table; each preview escaped, hex where the bytes are no UTF-8; ``hidden``:
    the dead letters of erased tenants left out, said below it; ``marks``: which were sent again
    (``daemon.dlq_marks``)."""
    if error:
        return f'<p class="bad" id="dlq-error">{esc(error)}</p>'
    rows = []
    for d in records:
        where = f"{d.topic} / {d.original_partition} / {d.original_offset}"
        kind = {"hex": "bytes (not UTF-8), as hex", "none": "left out of the record", "text": "text"}[d.preview_kind]
        cut = f", {d.size} bytes in all, cut" if d.cut else f", {d.size} bytes"
        rows.append(
            (
                f'<span class="dlq-reason">{esc(d.reason)}</span><br><span class="muted">{esc(d.code)}</span>',
                f'<span class="dlq-where">{esc(where)}</span>',
                esc(d.tenant or "?"),
                esc(d.failed_at),
                str(d.attempts),
                f'<span class="muted">{esc(kind + cut)}</span><pre class="bytes dlq-preview">{esc(d.preview)}</pre>',
                f"{d.partition}/{d.offset}",
                _sent_again(mark_of(d, topic, marks or {})),
            )
        )
    return (
        f'<p class="muted">The last {limit} records of each partition of {esc(topic)}, newest first, '
        "as read just now.</p>"
        + table(
            _COLUMNS,
            rows,
            table_id="dlq",
            empty="no dead letter",
        )
        + (
            f'<p class="muted" id="dlq-hidden">{hidden} dead letter(s) of erased tenants not shown '
            "(agentmemd erase-tenant): they stay in the topic until its retention removes them.</p>"
            if hidden
            else ""
        )
    )


def _sent_again(mark: ReplayMark | None) -> str:
    if mark is None:
        return '<span class="muted">no</span>'
    return f'<span class="dlq-replayed">{esc(mark.when)} to {esc(mark.to)}: {esc(mark.said)}</span>'
