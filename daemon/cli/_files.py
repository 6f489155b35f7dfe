"""The files ``publish doc`` sends: text files named or found under directories, read and
checked as text (pure but for reading the files)."""

from __future__ import annotations

import os
from pathlib import Path

from memory.errors import InvalidEvent

#: What a directory's file is first read of, to tell text from no text.
HEAD_BYTES = 8192


def read_text(path: Path) -> str:
    """A file's text as it is on disk (its line ends too), or an error that names the file
    (never a traceback).

    Raises:
        InvalidEvent: not UTF-8 text, or unreadable.
    """
    try:
        # Bytes, then decoded: read_text would turn CRLF line ends into LF, and `get` would not
        # read back the file as it is on disk.
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidEvent(f"{path} is not UTF-8 text (byte {exc.start}): only text files can be published") from exc
    except OSError as exc:
        raise InvalidEvent(f"{path} cannot be read: {exc.strerror or exc}") from exc
    if (at := binary_at(text)) is not None:
        raise InvalidEvent(f"{path} looks binary (a control character at {at}): only text files can be published")
    return text


#: Control characters that text files hold: tab, line feed, form feed, carriage return (and ESC, of ANSI colours).
_TEXT_CONTROLS = frozenset("\t\n\f\r\x1b")


def binary_at(text: str) -> int | None:
    """Where a NUL, or the first of the control characters making up over 1 % of the first
    8,192 characters, sits: what valid UTF-8 that is no text file holds (a PDF, an archive)."""
    if (nul := text.find("\x00")) >= 0:
        return nul
    head = text[:8192]
    odd = [i for i, c in enumerate(head) if c < " " and c not in _TEXT_CONTROLS]
    return odd[0] if odd and len(odd) * 100 > len(head) else None


def _holds_text(path: Path) -> str | None:
    """Why a directory's file is left out (no text, or unreadable), or None when it holds text;
    reads its first :data:`HEAD_BYTES` only."""
    try:
        with path.open("rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(head) < HEAD_BYTES or exc.start < len(head) - 3:
            return "not UTF-8"
        text = head[: exc.start].decode("utf-8")  # a character cut by the head's end is the file's
    if not text.strip():
        return "empty"
    if binary_at(text) is not None:
        return "binary"
    return None


def expand(paths: list[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The files of ``paths``: each file as given, and a directory's files under it in path
    order, each once. A directory's hidden files and directories (``.git``) and its symbolic
    links are left out unseen; its files that hold no text are left out and returned with why."""
    files: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    for path in paths:
        if not path.is_dir():
            files.append(path)
            continue
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(names):
                found = Path(root) / name
                if name.startswith(".") or found.is_symlink() or not found.is_file():
                    continue
                why = _holds_text(found)
                if why is None:
                    files.append(found)
                else:
                    skipped.append((found, why))
    return list(dict.fromkeys(files)), skipped
