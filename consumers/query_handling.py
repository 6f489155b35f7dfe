"""A request record to its reply and where the reply goes: the query subscriber's one call.

The reply topic and partition are checked before anything is answered (an asker reading a
topic we cannot reach is told so on the default one), a request older than the cut-off or of
an erased tenant is answered with an error, and the answer is fitted to one record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka import ConsumerRecord

from consumers.config import ConsumerConfig, Topics
from consumers.error_replies import crash_reply, error_body, error_reply
from consumers.errors import TenantErased, UnknownReplyTopic
from consumers.expiry import ExpiryLog, expired_error
from consumers.queries import answer, guess_query_id
from consumers.replies import PartitionCounts, default_reply_topic, own_reply_topic, reply_route, shared_replies
from consumers.reply_fit import fit
from consumers.requests import ErrorReply, GetReply, ListReply, QueryReply
from consumers.topic_names import tenant_from_topic
from graph import ScopedSearch
from memory.errors import BackendUnavailable, MemdError
from memory.tenants import ErasedTenants, erased_now, none_erased

log = structlog.get_logger()

#: Sends a reply: (its JSON, topic, correlation id, partition or None).
PublishReply = Callable[[dict[str, Any], str, str | None, int | None], Awaitable[object]]


@dataclass(frozen=True)
class Answered:
    """A request's reply, and the topic and partition (None: the producer's choice) it goes to."""

    reply: QueryReply | GetReply | ListReply | ErrorReply
    target: str
    partition: int | None
    tenant: str | None


@dataclass
class QueryHandling:
    """What answering a request needs, built once per subscriber."""

    search: ScopedSearch
    topics: Topics
    cfg: ConsumerConfig
    partition_counts: PartitionCounts
    inputs: Sequence[str]
    expiries: ExpiryLog
    # In topic tenancy, the erased tenants (``TenantRegistry.erased``): their requests are refused.
    erased_tenants: ErasedTenants = none_erased

    async def answer(self, record: ConsumerRecord[Any, Any], reply_to: str | None, now_ms: float) -> Answered:
        """``record``'s reply and its route; never raises (a bug is answered as one)."""
        cfg, topics = self.cfg, self.topics
        age_ms = now_ms - (record.timestamp or 0)
        expired = bool(record.timestamp) and age_ms > cfg.query_max_age_ms
        if expired:
            self.expiries.seen(record, age_ms)
        tenant = tenant_from_topic(record.topic, topics.requests, cfg.tenancy)
        default_target = default_reply_topic(topics.replies, cfg.tenancy, tenant)
        target = reply_to or default_target
        try:
            partition = await reply_route(
                target,
                record.headers,
                self.partition_counts,
                named=bool(reply_to),
                inputs=self.inputs,
                own=own_reply_topic(topics.replies, cfg.tenancy, tenant),
                replies=shared_replies(topics.replies, cfg.tenancy),
            )
        except MemdError as exc:
            # Not answered: the asker reads a topic or partition we cannot reach. The error goes
            # to the topic (or, when there is none, the default one), where a reader of every
            # partition or an operator sees it.
            refused = ErrorReply(query_id=guess_query_id(record.value), error=error_body(exc))
            return Answered(refused, default_target if isinstance(exc, UnknownReplyTopic) else target, None, tenant)
        except Exception as exc:  # a bug: the asker still hears back, on the default topic
            log.exception("query.reply_route_crashed")
            return Answered(crash_reply(exc, guess_query_id(record.value)), default_target, None, tenant)
        if expired:
            # Answered with an error, not skipped: an asker whose clock is behind the daemon's
            # by more than the cut-off would otherwise time out on every request, untold why.
            too_old = expired_error(age_ms, cfg.query_max_age_ms)
            reply: QueryReply | GetReply | ListReply | ErrorReply = ErrorReply(
                query_id=guess_query_id(record.value), error=error_body(too_old)
            )
        else:
            try:
                # The erasure's read too: with Redis hung, it waits as long as the search would.
                async with asyncio.timeout(cfg.query_timeout_s):
                    if tenant is not None and await self._erased(tenant):
                        # Not searched: 0 results would read as "nothing stored", where everything was erased.
                        reply = error_reply(TenantErased(tenant), guess_query_id(record.value))
                    else:
                        reply = await answer(record.value, self.search, tenant, max_bytes=cfg.reply_max_bytes)
            except TimeoutError:
                hung = BackendUnavailable(
                    f"no answer within {cfg.query_timeout_s:g} s (AGENTMEM_CONSUMER__QUERY_TIMEOUT_S): Redis or the "
                    "embedding model is hung or overloaded"
                )
                reply = error_reply(hung, guess_query_id(record.value))
        if not isinstance(reply, ErrorReply):
            reply = fit(reply, cfg.reply_max_bytes)
        return Answered(reply, target, partition, tenant)

    async def _erased(self, tenant: str) -> bool:
        """Whether ``tenant`` stands erased (read at most once a second). A failed read answers
        no: the search then says what is wrong with Redis."""
        if self.cfg.tenancy != "topic":
            return False
        try:
            return erased_now(await self.erased_tenants(), tenant) is not None
        except MemdError:
            return False


async def send_reply(publish: PublishReply, answered: Answered, correlation_id: str | None) -> None:
    """Publish ``answered``; a failure is logged (the asker times out), never raised into the poll."""
    try:
        await publish(answered.reply.model_dump(mode="json"), answered.target, correlation_id, answered.partition)
    except Exception as exc:  # KafkaError, or aiokafka's own check of the partition
        log.error(
            "query.reply_failed",
            topic=answered.target,
            partition=answered.partition,
            error=f"{type(exc).__name__}: {exc}",
        )
