"""Control characters of stored texts shown as their pictures (pure): what a memory holds is
shown, never obeyed, in the explorer's HTML and on a terminal alike."""

from __future__ import annotations

#: Control characters HTML text may not hold (a browser shows NUL as U+FFFD and drops the
#: rest), each shown as its control picture (U+2400 block): a stored text or a query that
#: holds one is shown as it is, visibly.
HTML_PICTURES = {c: 0x2400 + c for c in (*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20))} | {0x7F: 0x2421}
#: What a terminal may not be sent of a stored text: those, a carriage return (it would
#: overwrite the line shown) and the C1 controls (0x9B opens an escape sequence too), one
#: character each for one, so a styled text keeps its spans.
TERMINAL_PICTURES = HTML_PICTURES | {0x0D: 0x240D} | dict.fromkeys(range(0x80, 0xA0), 0xFFFD)


#: C1 controls and DEL as JSON escapes: pydantic writes them raw, and a terminal in UTF-8 may
#: act on U+009B as on ESC [. They stand only inside JSON strings, where the escape reads the same.
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0))}


def json_for_terminal(text: str) -> str:
    """JSON text (``--json`` output) with the controls a terminal may obey escaped: the same
    JSON to any parser."""
    return text.translate(_JSON_ESCAPES)


def for_terminal(text: str) -> str:
    """``text`` safe to print to a terminal: an escape sequence in a stored memory would clear
    the screen, retitle the window or fake lines, so each control character but tab and line
    feed is shown as its picture (``␛``), one character for one."""
    return text.translate(TERMINAL_PICTURES)
