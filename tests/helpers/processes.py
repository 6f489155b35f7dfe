"""Programs the tests run: Python snippets, `agentmemd` commands and daemon processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


_CHECKOUT = str(Path(__file__).resolve().parents[2])


async def run_python(tmp_path: Path, name: str, source: str, *, timeout: float) -> tuple[int | None, bytes, bytes]:
    """Run ``source`` as a script of its own with this checkout importable (as a daemon runs
    it, outside pytest's process); its exit code, stdout and stderr."""
    script = tmp_path / name
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_CHECKOUT, os.environ.get("PYTHONPATH", "")])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    return proc.returncode, out, err


class DaemonProcess:
    """`agentmemd run` as a child process, as an operator runs it; killable like a crash."""

    def __init__(self, env: dict[str, str], log_path: str) -> None:
        import os

        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.proc: Any = None

    def start(self, timeout: float = 120.0) -> DaemonProcess:
        import subprocess
        import sys
        import threading
        from pathlib import Path

        agentmemd = str(Path(sys.executable).parent / "agentmemd")
        log = open(self.log_path, "a")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen([agentmemd, "run"], env=self.env, stdout=subprocess.PIPE, stderr=log, text=True)
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                if "ready" in line:
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout):
            self.kill()
            raise AssertionError(f"daemon not ready in {timeout}s; see {self.log_path}")
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> int:
        """SIGTERM and wait: the clean shutdown path."""
        import signal

        if self.proc is None or self.proc.poll() is not None:
            return 0 if self.proc is None else int(self.proc.returncode)
        self.proc.send_signal(signal.SIGTERM)
        return int(self.proc.wait(timeout=60))


async def agentmemd(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI of this virtualenv with ``env`` added, run to the end off the event loop."""
    exe = str(Path(sys.executable).parent / "agentmemd")
    return await asyncio.to_thread(
        subprocess.run,
        [exe, *args],
        env={**os.environ, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
