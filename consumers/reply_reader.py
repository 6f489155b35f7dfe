"""The client's reply reader: a consumer of the reply topic (no group) that hands each reply to
the request waiting for its ``correlation_id``, paused while no request waits."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from consumers.kafka_clients import cluster_metadata, lost_partitions, set_fetch_wait, stop_quietly
from memory.errors import BackendUnavailable, NotFound

log = structlog.get_logger()

#: How long a reply is awaited before the reader is checked for a lost log, and then between
#: checks: a reply takes milliseconds, a write's ack seconds to minutes.
LOST_LOG_CHECK_S = 1.0
#: How long the broker may hold the reader's fetches once every reply it awaits has been
#: awaited ``LOST_LOG_CHECK_S``: then they are writes' acks, and at 5 ms a client waiting
#: minutes for a large document's ack sent ~140 fetches a second. A new request sets the
#: short wait again (its reply may still wait out one long fetch).
LONG_WAIT_FETCH_MS = 100


class ReplyReader:
    """Reads replies by correlation id: :meth:`expect` one, :meth:`wake` before its request is
    sent, :meth:`done_with` it after."""

    def __init__(
        self,
        *,
        bootstrap: str,
        topic: str,
        partition: int | None,
        fetch_wait_ms: int,
        idle_pause_s: float,
        kafka_options: dict[str, Any],
    ) -> None:
        """The arguments are ``MemoryClient``'s ``reply_*`` ones, which it documents."""
        self._bootstrap = bootstrap
        self.topic = topic
        self.partition = partition
        self._wait_ms = fetch_wait_ms
        self._idle_pause_s = idle_pause_s
        self._options = kafka_options
        self._pause_timer: asyncio.TimerHandle | None = None
        self._paused: AIOKafkaConsumer | None = None  # the consumer while it is paused
        self._waking: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._pending: dict[str, asyncio.Future[bytes]] = {}
        self._since: dict[str, float] = {}  # when each awaited reply was first awaited (the loop's time)
        self.fetch_wait_ms = fetch_wait_ms  # what the reader's fetches wait now
        self._reader: asyncio.Task[None] | None = None
        self._checking: asyncio.Task[None] | None = None  # a lost-log check (check_lost_log)
        self._checked_at = float("-inf")
        # Starting the reader awaits the broker: without the lock, queries racing to start it
        # would each start a consumer, and only the last would ever be stopped.
        self._lock = asyncio.Lock()

    async def ensure(self) -> None:
        """Start the reader, or a new one if the last one died.

        Raises:
            NotFound: the reply topic, or the reply partition asked for, does not exist.
            BackendUnavailable: the broker cannot be read.
        """
        async with self._lock:
            if self._reader is not None and not self._reader.done():
                return
            # A dead reader already failed the queries it held; its consumer may still be open.
            await self._stop()
            consumer = await self._start_consumer()
            self._consumer = consumer
            self.fetch_wait_ms = self._wait_ms  # as it was made
            self._reader = asyncio.create_task(self._read(consumer))

    def expect(self, cid: str) -> asyncio.Future[bytes]:
        """The future the reply with correlation id ``cid`` will complete."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes] = loop.create_future()
        self._pending[cid] = fut
        self._since[cid] = loop.time()
        self._fetch_wait(self._wait_ms)
        return fut

    def done_with(self, cid: str, fut: asyncio.Future[bytes]) -> None:
        """Stop waiting for ``cid``'s reply; the reader pauses once no reply is awaited for a while."""
        self._pending.pop(cid, None)
        self._since.pop(cid, None)
        if not self._pending:
            self._pause_later()
        if fut.done() and not fut.cancelled():
            fut.exception()  # seen: a reader failure during a failed send is no "never retrieved"

    def _fetch_wait(self, wait_ms: int) -> None:
        if wait_ms != self.fetch_wait_ms and self._consumer is not None and set_fetch_wait(self._consumer, wait_ms):
            self.fetch_wait_ms = wait_ms

    def check_lost_log(self) -> None:
        """Start a check for a log the broker lost under the reader (an embedded broker restarted
        empty), unless one runs or ran within ``LOST_LOG_CHECK_S``: one for all the requests
        waiting, never in their way."""
        loop = asyncio.get_running_loop()
        if self._since and loop.time() - max(self._since.values()) >= LOST_LOG_CHECK_S:
            self._fetch_wait(max(self._wait_ms, LONG_WAIT_FETCH_MS))
        if self._checking is not None and not self._checking.done():
            return
        if loop.time() - self._checked_at < LOST_LOG_CHECK_S:
            return
        self._checked_at = loop.time()
        self._checking = asyncio.create_task(self._recover_lost())

    async def _recover_lost(self) -> None:
        """Move a reader left past the end of a lost log back to the log's start: the replies
        since the restart are there, below the old position, and would not be read until the
        new log passed it. A failed check is left for the next one."""
        if self._consumer is None or self._paused is not None:  # a paused reader moves to the end as it wakes
            return
        consumer: AIOKafkaConsumer = self._consumer
        try:
            lost = await lost_partitions(consumer)
            if not lost:
                return
            tps = [tp for tp, _, _ in lost]
            starts = await asyncio.wait_for(consumer.beginning_offsets(tps), 5.0)
            if self._consumer is not consumer or self._paused is not None:
                return  # replaced, stopped or paused meanwhile: its successor starts where it must
            for tp, position, end in lost:
                log.warning(
                    "client.replies_rewound", topic=tp.topic, partition=tp.partition, position=position, log_end=end
                )
                consumer.seek(tp, starts.get(tp, 0))
        except (TimeoutError, KafkaError, IllegalStateError, AssertionError, OSError) as exc:
            log.debug("client.replies_check_failed", error=f"{type(exc).__name__}: {exc}")

    async def close(self) -> None:
        """Stop the reader and its consumer (a reader being started too, not leaked)."""
        async with self._lock:
            await self._stop()

    async def _start_consumer(self) -> AIOKafkaConsumer:
        # No consumer group: every client reads the reply partitions (all, or its own) from
        # "now" and picks its own correlation ids, so many clients can share one reply topic.
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            fetch_max_wait_ms=self._wait_ms,
            enable_auto_commit=False,
            **self._options,
        )
        try:
            try:
                await consumer.start()
                cluster = await cluster_metadata(consumer)
                tps = self._partitions(cluster.partitions_for_topic(self.topic))
                consumer.assign(tps)
                await consumer.seek_to_end(*tps)
                for tp in tps:
                    await consumer.position(tp)
            except KafkaError as exc:
                raise BackendUnavailable(f"reply topic {self.topic!r} unreadable: {exc}") from exc
        except BaseException:
            # One turn of the loop first: aiokafka's stop() awaits a task it cancels, and a task
            # cancelled before it ever ran raises CancelledError out of stop().
            await asyncio.sleep(0)
            await stop_quietly(consumer, "reply consumer")
            raise
        return consumer

    def _partitions(self, parts: set[int] | None) -> list[TopicPartition]:
        """The reply partitions to read, of those the topic has (``None``: no such topic).

        Raises:
            NotFound: the topic, or the partition asked for, does not exist.
        """
        if not parts:
            raise NotFound(
                f"reply topic {self.topic!r} does not exist: a daemon creates the shared topics as it "
                "starts (is one running against this broker?), an operator a tenant's with `agentmemd topics "
                "--tenant NAME` (is the tenant spelt right?); a reply topic of your own must be created first"
            )
        if self.partition is not None:
            if self.partition not in parts:
                raise NotFound(f"reply topic {self.topic!r} has no partition {self.partition}")
            parts = {self.partition}
        return [TopicPartition(self.topic, p) for p in sorted(parts)]

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        why, cause = "stopped", None
        try:
            async for msg in consumer:
                headers = {k: v for k, v in (msg.headers or ())}
                cid = (headers.get("correlation_id") or b"").decode("utf-8", "replace")
                fut = self._pending.pop(cid, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg.value or b"")
        except asyncio.CancelledError:
            why = "was closed"
            raise
        except Exception as exc:  # whatever it was, nobody else would see it: the task just ends
            log.warning("client.reply_reader_failed", topic=self.topic, error=f"{type(exc).__name__}: {exc}")
            why, cause = f"failed ({type(exc).__name__}: {exc})", exc
        finally:
            # Nothing reads their replies any more (the loop ended, failed, or the client was
            # closed under them): fail them now rather than at their timeouts. The next query
            # starts a new reader (the task is done from here on).
            message = f"the reply reader of {self.topic!r} {why}; the next query restarts it"
            pending, self._pending = self._pending, {}
            for fut in pending.values():
                if not fut.done():
                    error = BackendUnavailable(message)
                    error.__cause__ = cause
                    fut.set_exception(error)

    async def _stop(self) -> None:
        self._cancel_pause()
        waking, self._waking = self._waking, None
        if waking is not None:  # a move to the end that a broker gone away holds
            waking.cancel()
            await asyncio.wait([waking], timeout=5)
        checking, self._checking = self._checking, None
        if checking is not None:
            checking.cancel()
            await asyncio.wait([checking], timeout=5)  # never raises what it raised
        reader, self._reader = self._reader, None
        consumer, self._consumer = self._consumer, None
        if reader is not None:
            reader.cancel()
            # asyncio.wait, unlike awaiting it, never raises what it raised; bounded, since a
            # cancellation can be lost inside a client library (wait_for on Python 3.11).
            await asyncio.wait([reader], timeout=5)
        if consumer is not None:
            await stop_quietly(consumer, "reply consumer")
        if reader is not None and not reader.done():
            await asyncio.wait([reader], timeout=5)  # a stopped consumer ends its loop
            if not reader.done():
                log.warning("client.reply_reader_stuck", topic=self.topic)

    # With tansu's short fetch waits an idle client's reader polled ~200 times a second; paused,
    # it sends no fetch at all (consumers.idle does the same for the daemon's subscribers).

    def _cancel_pause(self) -> None:
        if self._pause_timer is not None:
            self._pause_timer.cancel()
            self._pause_timer = None

    def _pause_later(self) -> None:
        """Pause the reader once no reply has been awaited for ``idle_pause_s``."""
        self._cancel_pause()
        if self._idle_pause_s > 0:
            self._pause_timer = asyncio.get_running_loop().call_later(self._idle_pause_s, self._pause)

    def _pause(self) -> None:
        self._pause_timer = None
        consumer = self._consumer
        if self._pending or consumer is None or self._paused is not None:  # (waking: still paused)
            return
        consumer.pause(*consumer.assignment())
        self._paused = consumer

    async def wake(self) -> None:
        """Before a request is sent: a paused reader moved to the end of its partitions and
        resumed. Every request sent meanwhile waits for the same move: a reply sent before the
        move completed could be skipped by it."""
        self._cancel_pause()
        if self._paused is None:
            return
        if self._waking is None:
            self._waking = asyncio.create_task(self._catch_up(self._paused))
        waking = self._waking
        try:
            await asyncio.shield(waking)
        except asyncio.CancelledError:
            this = asyncio.current_task()
            if waking.cancelled() and (this is None or this.cancelling() == 0):
                # close() ended the move under this request, which nobody cancelled.
                raise BackendUnavailable(f"the reply reader of {self.topic!r} was closed") from None
            raise

    async def _catch_up(self, consumer: AIOKafkaConsumer) -> None:
        replaced = consumer is not self._consumer  # a fresh reader starts at the end, unpaused
        try:
            if not replaced:
                tps = consumer.assignment()
                await consumer.seek_to_end(*tps)
                for tp in tps:
                    await consumer.position(tp)  # the reset done (it runs while paused)
        finally:
            # Resumed even if the move failed: reading the pile is slower, never deaf.
            consumer.resume(*consumer.assignment())
            self._paused = self._waking = None
            if not self._pending:  # every request gave up meanwhile (the broker was down): pause again
                self._pause_later()
