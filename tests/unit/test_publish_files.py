"""What `publish doc` sends of files and directories, and how many it keeps in flight (pure)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from daemon.cli._files import HEAD_BYTES, expand
from daemon.cli.publish import InFlight


def test_a_directory_gives_its_text_files_in_order_and_says_why_it_left_others_out(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    (root / "b").mkdir(parents=True)
    (root / ".git" / "objects").mkdir(parents=True)
    (root / "a.md").write_text("alpha", encoding="utf-8")
    (root / "b" / "c.md").write_text("gamma", encoding="utf-8")
    (root / ".git" / "objects" / "x").write_text("hidden", encoding="utf-8")
    (root / ".env").write_text("SECRET=1", encoding="utf-8")
    (root / "blank.md").write_text(" \n", encoding="utf-8")
    (root / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (root / "report.pdf").write_bytes(b"%PDF-1.4\n" + bytes(range(1, 32)) * 50)
    # A long text whose head ends inside a character: text all the same.
    (root / "long.md").write_bytes(b"x" * (HEAD_BYTES - 1) + "é and more".encode())
    os.symlink(tmp_path / "elsewhere.md", root / "link.md")
    (tmp_path / "elsewhere.md").write_text("outside the tree", encoding="utf-8")
    alone = tmp_path / "alone.md"
    alone.write_text("named", encoding="utf-8")

    files, skipped = expand([root, alone, root / "a.md"])
    assert files == [root / "a.md", root / "long.md", root / "b" / "c.md", alone]
    assert sorted((p.name, why) for p, why in skipped) == [
        ("blank.md", "empty"),
        ("latin1.txt", "not UTF-8"),
        ("report.pdf", "binary"),
    ]


async def test_in_flight_holds_at_most_so_many_documents_and_bytes_but_always_one() -> None:
    room = InFlight(3, 100)
    now: list[int] = []
    peak = {"n": 0, "size": 0}

    async def one(size: int) -> None:
        async with room.taken(size):
            now.append(size)
            peak["n"], peak["size"] = max(peak["n"], len(now)), max(peak["size"], sum(now))
            await asyncio.sleep(0.01)
            now.remove(size)

    await asyncio.gather(*(one(s) for s in [10] * 8 + [60, 60, 500]))
    assert peak["n"] == 3  # never more documents than allowed
    assert peak["size"] == 500  # the one larger than the room went, alone
    peak.update(n=0, size=0)
    await asyncio.gather(*(one(s) for s in [40] * 6))
    assert peak["size"] <= 100 and peak["n"] == 2


def test_a_file_is_read_with_its_own_line_ends(tmp_path: Path) -> None:
    """A file written with CRLF (or CR) line ends is published as it is on disk, so `get`
    reads it back byte for byte."""
    from daemon.cli._files import read_text

    crlf = tmp_path / "crlf.md"
    crlf.write_bytes(b"# Title\r\n\r\nBody line\r\nand more\r")
    assert read_text(crlf) == "# Title\r\n\r\nBody line\r\nand more\r"
