"""Helpers the tests share, one module per kind: settings, daemons, processes, Kafka, waiting, browser,
stacks (a memory of a test's own), counting (an embedder that keeps what it is sent), results (replies' items)."""

from tests.helpers.browser import chromium, chromium_flags
from tests.helpers.daemons import (
    close_shared_workers,
    daemon_and_client,
    reindex,
    shared_workers,
    start_daemon,
    topic_tenancy_daemon,
)
from tests.helpers.kafka import PlainClient, read_dlq
from tests.helpers.processes import DaemonProcess, agentmemd, run_python
from tests.helpers.settings import TEST_SESSION_MS, isolated_settings, settings_env
from tests.helpers.waiting import eventually, in_graph, stored_chunks, wait_for_chunks

__all__ = [
    "TEST_SESSION_MS",
    "DaemonProcess",
    "PlainClient",
    "agentmemd",
    "chromium",
    "chromium_flags",
    "close_shared_workers",
    "daemon_and_client",
    "eventually",
    "in_graph",
    "isolated_settings",
    "read_dlq",
    "reindex",
    "run_python",
    "settings_env",
    "shared_workers",
    "start_daemon",
    "stored_chunks",
    "topic_tenancy_daemon",
    "wait_for_chunks",
]
