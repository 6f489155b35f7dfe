"""doctor's checks of Kafka: the broker, the contract's and tenants' topics, the consumer
groups' lag and members."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from consumers.topic_names import tenant_from_topic
from daemon.connections import kafka_options, redis_client
from daemon.doctor_finding import Finding
from daemon.launcher import running_holder
from daemon.settings import Settings
from daemon.status import group_members, measure_lag, past_end_text
from daemon.teardown import bounded
from daemon.topics import tenant_topics
from memory.errors import MemdError
from memory.tenants import TenantRegistry


async def check_kafka(settings: Settings) -> list[Finding]:
    """The broker reachable, every topic the daemon needs there, and the consumer groups' lag,
    members and committed positions."""
    found: list[Finding] = []
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=5000, **kafka_options(settings)
    )
    try:
        await asyncio.wait_for(consumer.start(), timeout=15)
        topics = await consumer.topics()
    except (KafkaError, OSError, TimeoutError) as exc:
        with_fix = (
            f"start a broker at {settings.kafka_bootstrap} (`agentmemd servers` for a local one) "
            "or fix AGENTMEM_KAFKA_BOOTSTRAP / AGENTMEM_KAFKA_SECURITY__*"
        )
        if (holder := running_holder(settings.data_dir)) is not None:
            # Its embedded broker died or hangs: a second one on the data dir is refused.
            with_fix = (
                f"the embedded broker of the `agentmemd up` (or `servers`) running as pid {holder} on "
                f"{settings.data_dir} does not answer: stop that process (Ctrl-C, or kill {holder}) and start it "
                "again; if it is not the broker you meant, fix AGENTMEM_KAFKA_BOOTSTRAP"
            )
        return [
            Finding("kafka", False, f"cannot reach {settings.kafka_bootstrap}: {type(exc).__name__}: {exc}", with_fix)
        ]
    finally:
        await bounded("stop the kafka probe", consumer.stop())
    found.append(Finding("kafka", True, f"reachable at {settings.kafka_bootstrap}"))
    t = settings.topics
    wanted = [t.replies, t.dlq]
    tenants: list[str] = []
    unread = False
    if settings.consumer.tenancy == "single":
        wanted += [t.documents, t.transcripts, t.requests]
    else:
        known = await _seen_tenants(settings)
        unread = known is None
        tenants = known or []
        wanted += [name for tenant in tenants for name in tenant_topics(settings, tenant)]
    missing = [name for name in wanted if name not in topics]
    if missing:
        lost = sorted({tenant for tenant in tenants if set(tenant_topics(settings, tenant)) - set(topics)})
        fix = (
            "start the daemon once (it creates them when AGENTMEM_CREATE_TOPICS is true) "
            "or create them with your Kafka tooling"
        )
        if lost:
            named = " ".join(f"--tenant {t}" for t in lost[:5])
            fix += f"; a tenant's: a running daemon recreates them, or `agentmemd topics {named}`"
        found.append(Finding("topics", False, f"missing: {', '.join(missing[:12])}", fix))
    elif settings.consumer.tenancy != "single" and not tenants:
        # No daemon has read a tenant's event yet: "all present" would hide that no tenant is
        # served, and "no tenant yet" would deny topics an operator created for one.
        onboarded = sorted({x for name in topics if (x := tenant_from_topic(name, t.documents, "topic"))})
        detail = f"the {len(wanted)} shared ones present ({t.replies}, {t.dlq})"
        if unread:
            detail += "; which tenants daemons serve is unknown: Redis did not say (see its check)"
        elif onboarded:
            detail += f"; tenants with topics, none of whose events a daemon has read yet: {', '.join(onboarded[:10])}"
        else:
            detail += "; no tenant yet: `agentmemd topics --tenant NAME` onboards one"
        found.append(Finding("topics", True, detail))
    else:
        seen = f", {len(tenants)} tenants' included" if tenants else ""
        found.append(Finding("topics", True, f"all {len(wanted)} present{seen}"))
    try:
        report = await asyncio.wait_for(measure_lag(settings), timeout=20)
        detail = ", ".join(f"{g}: lag {sum(p.values())}" for g, p in sorted(report.lag.items()))
        if report.past_end:
            beyond = past_end_text(report.past_end)
            found.append(
                Finding(
                    "consumer groups",
                    False,
                    f"committed past the end of the log (the broker lost it?): {beyond}",
                    "running daemons move their consumers back to the log's start within "
                    "AGENTMEM_TOPIC_CHECK_S; if this stays, restart them",
                )
            )
        else:
            found.append(Finding("consumer groups", True, f"{detail}; {report.dlq} DLQ records"))
        found.extend(await _check_daemons(settings, sorted(report.lag)))
    except (KafkaError, OSError, TimeoutError) as exc:
        found.append(
            Finding("consumer groups", False, f"cannot read offsets: {exc}", "check broker ACLs for the groups")
        )
    return found


async def _check_daemons(settings: Settings, groups: list[str]) -> list[Finding]:
    """Whether a daemon consumes: each group has a member. Lag alone cannot say: with no
    daemon running it stays where the last one left it, often 0, and all looked well."""
    try:
        members = await group_members(settings, groups)
    except (KafkaError, OSError, TimeoutError) as exc:
        return [Finding("daemons", False, f"cannot describe the groups: {exc}", "check broker ACLs for the groups")]
    except MemdError as exc:  # not authorized, a coordinator loading or moving: says nothing of members
        return [Finding("daemons", False, str(exc), "check broker ACLs for the groups, or retry")]
    idle = [g for g in groups if not members.get(g)]
    if not idle:
        return [Finding("daemons", True, ", ".join(f"{g}: {members[g]} member(s)" for g in groups))]
    start = "start one (`agentmemd run`, or `agentmemd up` on one machine); its log and /readyz say what it waits for"
    if len(idle) == len(groups):
        return [Finding("daemons", False, f"no daemon is consuming: no member in {', '.join(idle)}", start)]
    return [
        Finding(
            "daemons",
            False,
            f"no member in {', '.join(idle)}: their topics are not read",
            "a daemon that is still starting joins within moments; else " + start,
        )
    ]


async def _seen_tenants(settings: Settings) -> list[str] | None:
    """The tenants daemons have seen (topic tenancy), or None when Redis cannot say (its own finding says why)."""
    client = redis_client(settings)
    try:
        return await asyncio.wait_for(TenantRegistry(client=client, name=settings.index.name).with_topics(), timeout=10)
    except (MemdError, TimeoutError):
        return None
    finally:
        await client.aclose()
