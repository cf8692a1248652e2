"""Incident notifications (agent/notify.py) against real HTTP servers: the webhook receiver of
tests/servers/receiver.py on loopback, answering 200, 500, 429 with Retry-After, slowly, or not at all
(down), and Debian's Alertmanager. Time is looptime's fake loop time where backoff and rate limits
are asserted (the notifier's clock is the loop clock), while real sockets carry every request.

What must hold: every notice reaches every sink at least once, none twice beyond its dedup key,
across receiver outages and agent restarts; temporary failures back off, permanent ones are dead and
noted; a 500-incident outage is a handful of messages; secrets never reach a log.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pydantic import ValidationError
from servers.alertmanager import AlertmanagerServer, require_alertmanager
from servers.kube import KubeEmulator, require_kmock
from servers.receiver import Receiver, Reply, Request, ThreadedReceiver

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.config import NotifySettings, Role, Settings, SinkSettings, load_settings
from trainmedic.agent.notify import DEDUP_HEADER, Notifier, NotifyError, backoff_delay, dedup_key_of, parse_retry_after
from trainmedic.agent.outbox import ItemState, Outbox
from trainmedic.agent.run import build_agent, run_agent
from trainmedic.agent.store import IncidentStore
from trainmedic.agent.telemetry import Telemetry
from trainmedic.events import DiagnosisEvent, Event, IncidentEvent, JobRef, Topic, make_event
from trainmedic.models import (
    Action,
    Chip,
    Diagnosis,
    FaultClass,
    Finding,
    I18nText,
    RootCause,
    Severity,
    Source,
)
from trainmedic.reports import payloads
from trainmedic.reports.notice import Notice

BASE = 1_700_000_000.0
SECRET = "s3cret-signing-key"
OK_BODY: dict[str, Any] = {
    "cloudevents": b"",
    "alertmanager": b"",
    "feishu": {"code": 0, "msg": "success", "data": {}},
    "dingtalk": {"errcode": 0, "errmsg": "ok"},
    "wecom": {"errcode": 0, "errmsg": "ok"},
    "slack": "ok",
}


def root_cause(node: str = "gpu-node-a") -> RootCause:
    return RootCause(
        fault_class=FaultClass.DEVICE_ERROR,
        chip=Chip.NVIDIA,
        code="xid:79",
        vendor_action="RESTART_BM",
        action=Action.REBOOT_NODE,
        node=node,
        device="GPU-3",
        rank=5,
        summary=I18nText(en="GPU has fallen off the bus", zh="GPU 已从总线掉卡"),
        hint=I18nText(en="Drain the node and reseat the GPU", zh="排空节点并重新插拔 GPU"),
        rule_id="nvidia.xid.79",
        severity=Severity.CRITICAL,
    )


def incident_event(incident: str = "inc-1", status: str = "acting", *, at: float | None = None) -> Event:
    payload = IncidentEvent(
        incident_id=incident,
        status=status,
        job=JobRef(namespace="train", name="llama"),
        node="gpu-node-a",
        root_cause=root_cause(),
        mode="enforce",
        actions=[{"name": "quarantine_node", "state": "done", "result": {"node": "gpu-node-a"}}],
    )
    return make_event(payload, producer="brain/test", at=at or BASE)


def sink(kind: str, url: str, **over: Any) -> dict[str, Any]:
    return {"kind": kind, "url": url, **over}


def value(telemetry: Telemetry, name: str, **labels: str) -> float:
    got = telemetry.registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


@dataclass
class Harness:
    """Notifiers over one outbox file, the incident store beside it, and one receiver."""

    path: Path
    rx: Receiver
    store: IncidentStore
    telemetry: Telemetry = field(default_factory=Telemetry)
    running: list[tuple[Notifier, asyncio.Event, asyncio.Task[None] | None]] = field(default_factory=list)
    notes: bool = False

    @staticmethod
    def clock() -> float:
        return BASE + asyncio.get_running_loop().time()

    def notifier(self, *sinks: dict[str, Any], env: Mapping[str, str] | None = None, **opts: Any) -> Notifier:
        settings = NotifySettings.model_validate({"sinks": list(sinks), **opts})
        return Notifier(
            settings,
            outbox=Outbox(self.path, clock=self.clock),
            # Timeline notes only where the test opened its incidents in the store.
            store=self.store if self.notes else None,
            telemetry=self.telemetry,
            clock=self.clock,
            rng=random.Random(7),
            report_url=lambda i: f"https://trainmedic.example/api/v1/incidents/{i}/report",
            env=env,
        )

    async def start(self, *sinks: dict[str, Any], env: Mapping[str, str] | None = None, **opts: Any) -> Notifier:
        n = self.notifier(*sinks, env=env, **opts)
        stop = asyncio.Event()
        task = asyncio.create_task(n.run(stop))
        self.running.append((n, stop, task))
        return n

    def track(self, n: Notifier) -> Notifier:
        self.running.append((n, asyncio.Event(), None))
        return n

    async def kill(self, n: Notifier) -> None:
        """Stop a notifier the way a dying process does: what is in flight is abandoned."""
        for entry in list(self.running):
            if entry[0] is n:
                self.running.remove(entry)
                _, _stop, task = entry
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
        await n.aclose()
        n.outbox.close()

    async def close(self) -> None:
        for n, stop, task in self.running:
            stop.set()
            if task is not None:
                await asyncio.wait_for(task, 30)
            await n.aclose()
            n.outbox.close()
        self.running.clear()

    def incident(self, incident_id: str) -> None:
        self.notes = True
        self.store.open_incident(incident_id, key="job:train/llama", diagnosis={}, revision=1)

    def timeline(self, incident_id: str, kind: str) -> list[dict[str, Any]]:
        return [e["detail"] for e in self.store.timeline(incident_id) if e["kind"] == kind]

    async def settled(self, n: Notifier, count: int, timeout: float = 3600) -> None:
        """Wait (loop time) until `count` outbox items are no longer pending."""
        async with asyncio.timeout(timeout):
            while sum(n.outbox.counts().values()) - n.outbox.depth() < count:
                await asyncio.sleep(0.05)


@pytest_asyncio.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    db = tmp_path / "trainmedic.db"
    store = IncidentStore(db, clock=Harness.clock)
    async with Receiver() as rx:
        harness = Harness(db, rx, store)
        try:
            yield harness
        finally:
            await harness.close()
            store.close()


def keys(requests: list[Request]) -> list[str | None]:
    return [r.header(DEDUP_HEADER) for r in requests]


# -- one incident, one receiver ------------------------------------------------------------------------


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_one_incident_reaches_a_cloudevents_receiver_signed_at_once(h: Harness) -> None:
    h.incident("inc-1")
    n = await h.start(sink("cloudevents", h.rx.url + "/hook", secret=SECRET), source="//trainmedic/test")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await n.enqueue(incident_event("inc-1", "acting"))
    (req,) = await h.rx.wait_for(1)
    # Straight away: no timer, no batching window between the enqueue and the request.
    assert req.loop_time - t0 < 0.005
    assert req.method == "POST" and req.path == "/hook"
    assert req.header("content-type") == "application/cloudevents+json; charset=utf-8"
    assert req.header(DEDUP_HEADER) == "inc-1/acting"
    assert payloads.verify(SECRET.encode(), req.headers, req.body, now=h.clock())
    assert not payloads.verify(b"another-secret", req.headers, req.body, now=h.clock())
    event = req.json()
    assert event["id"] == "inc-1/acting"
    assert event["specversion"] == "1.0"
    assert event["type"] == "io.trainmedic.incident.acting"
    assert event["source"] == "//trainmedic/test"
    assert event["data"]["report_url"] == "https://trainmedic.example/api/v1/incidents/inc-1/report"
    await h.settled(n, 1)
    (item,) = n.outbox.items()
    assert item.state is ItemState.DELIVERED
    assert h.timeline("inc-1", "notified") == [{"sink": "cloudevents", "status": "acting", "http": 200, "attempt": 1}]
    t = h.telemetry
    assert value(t, "trainmedic_notifications_total", sink="cloudevents", outcome="queued") == 1
    assert value(t, "trainmedic_notifications_total", sink="cloudevents", outcome="delivered") == 1
    assert value(t, "trainmedic_outbox_depth", sink="cloudevents") == 0


@pytest.mark.asyncio
async def test_one_incident_reaches_a_local_receiver_within_milliseconds(h: Harness) -> None:
    """Real time, real sockets: the diagnosis-to-webhook path adds milliseconds, not a batching delay."""
    n = await h.start(sink("cloudevents", h.rx.url, secret=SECRET))
    await asyncio.sleep(0.05)  # the delivery loop is idle, waiting
    latencies = []
    for i in range(5):
        t0 = time.time()
        await n.enqueue(incident_event(f"inc-{i}", "acting"))
        req = (await h.rx.wait_for(i + 1))[-1]
        latencies.append(req.time - t0)
    assert max(latencies) < 0.2, latencies


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_replayed_incident_event_is_sent_once(h: Harness) -> None:
    n = await h.start(sink("cloudevents", h.rx.url))
    await n.enqueue(incident_event("inc-1", "acting"))
    # The same state again, in a new envelope (the bus replayed it after a restart).
    await n.enqueue(incident_event("inc-1", "acting", at=BASE + 5))
    await n.enqueue(incident_event("inc-1", "resolved"))
    await h.settled(n, 2)
    await asyncio.sleep(60)
    assert keys(h.rx.requests) == ["inc-1/acting", "inc-1/resolved"]
    assert value(h.telemetry, "trainmedic_notifications_total", sink="cloudevents", outcome="duplicate") == 1


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_only_the_statuses_a_sink_wants_are_queued(h: Harness) -> None:
    n = await h.start(sink("slack", h.rx.url + "/chat", name="people"), sink("cloudevents", h.rx.url + "/ce"))
    for status in ("open", "acting", "resolved"):
        await n.enqueue(incident_event("inc-1", status))
    await h.settled(n, 4)
    assert [r.path for r in h.rx.accepted].count("/ce") == 3
    # Chat robots reach people: the outcome, not every intermediate step.
    assert [r.header(DEDUP_HEADER) for r in h.rx.accepted if r.path == "/chat"] == ["inc-1/resolved"]


# -- temporary failures ---------------------------------------------------------------------------------


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_server_errors_are_retried_with_jittered_exponential_backoff(h: Harness) -> None:
    h.incident("inc-1")
    h.rx.script(Reply(500, b"boom"), Reply(503, b"busy"), Reply(502))
    n = await h.start(sink("cloudevents", h.rx.url), retry_initial_s=2, retry_max_s=60)
    await n.enqueue(incident_event("inc-1"))
    await h.settled(n, 1)
    reqs = h.rx.requests
    assert [r.status for r in reqs] == [500, 503, 502, 200]
    assert set(keys(reqs)) == {"inc-1/acting"}
    gaps = [b.loop_time - a.loop_time for a, b in itertools.pairwise(reqs)]
    # Full jitter: the n-th wait is uniform in [0, initial * 2**(n-1)].
    for k, gap in enumerate(gaps):
        assert 0 <= gap <= 2 * 2**k + 1e-6, gaps
    (item,) = n.outbox.items()
    assert (item.state, item.attempts) == (ItemState.DELIVERED, 4)
    assert h.timeline("inc-1", "notified") == [{"sink": "cloudevents", "status": "acting", "http": 200, "attempt": 4}]
    assert value(h.telemetry, "trainmedic_webhook_failures_total", sink="cloudevents") == 3


@pytest.mark.parametrize(("failures", "cap"), [(1, 1.0), (2, 2.0), (5, 16.0), (30, 300.0)])
def test_backoff_is_full_jitter_under_a_doubling_cap(failures: int, cap: float) -> None:
    rng = random.Random(1)
    delays = [backoff_delay(failures, initial=1.0, maximum=300.0, rng=rng) for _ in range(200)]
    assert min(delays) >= 0 and max(delays) <= cap
    assert max(delays) > cap / 2  # the whole range is used, not a fixed delay


@pytest.mark.parametrize(
    ("header", "expected"),
    [("30", 30.0), ("0", 0.0), ("1.5", 1.5), ("Wed, 21 Oct 2015 07:28:00 GMT", 60.0), ("soon", None), (None, None)],
)
def test_retry_after_is_seconds_or_an_http_date(header: str | None, expected: float | None) -> None:
    now = 1445412420.0  # 07:27:00 that day
    assert parse_retry_after(header, now=now) == expected


@pytest.mark.looptime
@pytest.mark.asyncio
@pytest.mark.parametrize(("retry_after", "expected_wait"), [(30, 30), (7200, 120)])
async def test_429_retry_after_is_honoured_and_capped(h: Harness, retry_after: float, expected_wait: float) -> None:
    h.rx.script(Reply(429, b"slow down", retry_after=retry_after))
    n = await h.start(sink("cloudevents", h.rx.url), retry_max_s=120)
    await n.enqueue(incident_event("inc-1"))
    await n.enqueue(incident_event("inc-2"))
    await h.settled(n, 2)
    first, second, third = h.rx.requests
    assert first.status == 429
    assert second.loop_time - first.loop_time == pytest.approx(expected_wait, abs=0.01)
    # The whole sink waited, in order: inc-2 did not overtake the held inc-1.
    assert keys([second, third]) == ["inc-1/acting", "inc-2/acting"]


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_receiver_that_is_down_loses_nothing_and_gets_each_notice_once(h: Harness) -> None:
    await h.rx.stop()
    n = await h.start(sink("cloudevents", h.rx.url))
    sent = [("inc-1", "acting"), ("inc-2", "blocked"), ("inc-1", "resolved")]
    for incident, status in sent:
        await n.enqueue(incident_event(incident, status))
    await asyncio.sleep(600)
    assert h.rx.requests == []
    assert n.outbox.depth("cloudevents") == 3
    assert value(h.telemetry, "trainmedic_outbox_depth", sink="cloudevents") == 3
    errors = {i.last_error for i in n.outbox.items()}
    assert any(e and "ConnectError" in e for e in errors), errors
    await h.rx.start()
    await h.settled(n, 3)
    assert keys(h.rx.accepted) == [f"{i}/{s}" for i, s in sent]
    assert len(h.rx.requests) == 3
    assert value(h.telemetry, "trainmedic_outbox_depth", sink="cloudevents") == 0


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_slow_receiver_times_out_and_gets_the_same_dedup_key_again(h: Harness) -> None:
    h.rx.script(Reply(delay_s=30))
    n = await h.start(sink("cloudevents", h.rx.url, timeout_s=5), retry_initial_s=1)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await n.enqueue(incident_event("inc-1"))
    await h.settled(n, 1)
    assert loop.time() - t0 < 10  # the 30 s answer was not waited for
    (item,) = n.outbox.items()
    assert item.state is ItemState.DELIVERED and item.attempts == 2
    assert set(keys(h.rx.requests)) == {"inc-1/acting"}
    assert len(h.rx.requests) == 2


# -- permanent failures ---------------------------------------------------------------------------------


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_4xx_is_permanent_dead_and_noted_and_blocks_nothing(h: Harness) -> None:
    h.incident("inc-1")
    h.rx.script(Reply(400, b"bad payload"))
    n = await h.start(sink("cloudevents", h.rx.url))
    await n.enqueue(incident_event("inc-1", "acting"))
    await n.enqueue(incident_event("inc-2", "acting"))
    await h.settled(n, 2)
    await asyncio.sleep(600)
    assert [r.status for r in h.rx.requests] == [400, 200]  # never retried
    dead, delivered = n.outbox.items()
    assert dead.state is ItemState.DEAD and dead.last_error == "HTTP 400: bad payload"
    assert delivered.state is ItemState.DELIVERED
    (note,) = h.timeline("inc-1", "notify_failed")
    assert note == {
        "sink": "cloudevents",
        "status": "acting",
        "http": 400,
        "attempt": 1,
        "error": "HTTP 400: bad payload",
        "permanent": True,
    }
    assert value(h.telemetry, "trainmedic_notifications_total", sink="cloudevents", outcome="dead") == 1
    assert value(h.telemetry, "trainmedic_webhook_failures_total", sink="cloudevents") == 1


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_notice_is_given_up_after_give_up_after_s(h: Harness) -> None:
    h.incident("inc-1")
    h.rx.default = Reply(503, b"down for maintenance")
    n = await h.start(sink("cloudevents", h.rx.url), retry_initial_s=1, retry_max_s=30, give_up_after_s=300)
    await n.enqueue(incident_event("inc-1"))
    await h.settled(n, 1)
    (item,) = n.outbox.items()
    assert item.state is ItemState.DEAD
    assert item.last_error is not None and item.last_error.startswith("gave up after 300 s: HTTP 503")
    assert item.finished is not None and item.finished - item.created <= 300
    (note,) = h.timeline("inc-1", "notify_failed")
    assert note["permanent"] is False and note["http"] == 503
    assert len(h.rx.requests) == item.attempts


@pytest.mark.looptime
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("kind", "reply", "outcome"),
    [
        ("feishu", Reply(200, {"code": 0, "msg": "success"}), "delivered"),
        ("feishu", Reply(200, {"StatusCode": 0, "StatusMessage": "success"}), "delivered"),
        ("feishu", Reply(200, {"code": 11232, "msg": "frequency limited"}), "retry"),
        ("feishu", Reply(400, {"code": 11232, "msg": "frequency limited"}), "retry"),
        ("feishu", Reply(200, {"code": 19021, "msg": "sign match fail"}), "dead"),
        ("dingtalk", Reply(200, {"errcode": 130101, "errmsg": "send too fast"}), "retry"),
        ("dingtalk", Reply(200, {"errcode": 310000, "errmsg": "keywords not in content"}), "dead"),
        ("wecom", Reply(200, {"errcode": 45009, "errmsg": "api freq out of limit"}), "retry"),
        ("wecom", Reply(200, {"errcode": 93000, "errmsg": "invalid webhook url"}), "dead"),
        ("slack", Reply(429, "rate_limited", retry_after=1), "retry"),
        ("slack", Reply(404, "no_service"), "dead"),
        ("slack", Reply(200, "ok"), "delivered"),
    ],
)
async def test_chat_robots_errors_in_the_body(h: Harness, kind: str, reply: Reply, outcome: str) -> None:
    h.rx.default = Reply(200, OK_BODY[kind])
    h.rx.script(reply)
    n = await h.start(sink(kind, h.rx.url + "/robot"))
    await n.enqueue(incident_event("inc-1", "failed"))
    await h.settled(n, 1)
    await asyncio.sleep(60)
    (item,) = n.outbox.items()
    if outcome == "dead":
        assert item.state is ItemState.DEAD
        assert len(h.rx.requests) == 1
        assert item.last_error and (str(reply.status) in item.last_error)
    else:
        assert item.state is ItemState.DELIVERED
        assert len(h.rx.requests) == (2 if outcome == "retry" else 1)


# -- what each sink receives ----------------------------------------------------------------------------


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_dingtalk_urls_are_signed_and_feishu_bodies_carry_their_signature(h: Harness) -> None:
    h.rx.default = Reply(200, {"errcode": 0, "code": 0})
    n = await h.start(
        sink("dingtalk", h.rx.url + "/robot/send?access_token=tok", secret="SECding"),
        sink("feishu", h.rx.url + "/open-apis/bot/v2/hook/abc", secret="SECfei"),
        sink("wecom", h.rx.url + "/cgi-bin/webhook/send?key=k"),
    )
    await n.enqueue(incident_event("inc-1", "blocked"))
    await h.settled(n, 3)
    by_path = {r.path: r for r in h.rx.accepted}
    ding = by_path["/robot/send"]
    q = ding.query
    assert q["access_token"] == ["tok"]
    assert q["sign"] == [payloads.dingtalk_sign("SECding", int(q["timestamp"][0]))]
    assert abs(int(q["timestamp"][0]) / 1000 - h.clock()) < 5
    assert ding.json()["msgtype"] == "markdown"
    fei = by_path["/open-apis/bot/v2/hook/abc"].json()
    assert fei["sign"] == payloads.feishu_sign("SECfei", int(fei["timestamp"]))
    assert fei["msg_type"] == "interactive"
    wecom = by_path["/cgi-bin/webhook/send"]
    assert wecom.query["key"] == ["k"] and wecom.json()["msgtype"] == "markdown"
    assert all(r.header(DEDUP_HEADER) == "inc-1/blocked" for r in h.rx.accepted)


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_alertmanager_gets_firing_then_resolved_on_api_v2_alerts(h: Harness) -> None:
    n = await h.start(sink("alertmanager", h.rx.url + "/"))
    await n.enqueue(incident_event("inc-1", "acting"))
    await h.settled(n, 1)
    await n.enqueue(incident_event("inc-1", "resolved", at=BASE + 60))
    await h.settled(n, 2)
    firing, resolved = h.rx.accepted
    assert firing.path == resolved.path == "/api/v2/alerts"
    (a,) = firing.json()
    assert a["labels"]["incident"] == "inc-1" and a["labels"]["alertname"] == "TrainmedicIncident"
    assert "endsAt" not in a
    (b,) = resolved.json()
    assert b["labels"] == a["labels"]  # the same alert, now ended
    assert "endsAt" in b


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_alertmanager_alerts_still_firing_are_sent_again_until_they_end(h: Harness) -> None:
    n = await h.start(sink("alertmanager", h.rx.url, resend_s=60, resend_for_s=300))
    t0 = asyncio.get_running_loop().time()
    await n.enqueue(incident_event("inc-1", "blocked"))
    await n.enqueue(incident_event("inc-2", "acting"))
    await asyncio.sleep(150)
    await n.enqueue(incident_event("inc-2", "resolved"))
    await asyncio.sleep(200)

    def sent(r: Request) -> list[tuple[str, bool]]:
        return [(a["labels"]["incident"], "endsAt" in a) for a in r.json()]

    got = [(round(r.loop_time - t0), sent(r)) for r in h.rx.accepted]
    assert got == [
        (0, [("inc-1", False), ("inc-2", False)]),
        (60, [("inc-1", False), ("inc-2", False)]),
        (120, [("inc-1", False), ("inc-2", False)]),
        (150, [("inc-2", True)]),  # resolved: never re-sent as firing
        (210, [("inc-1", False)]),  # a period after the last POST
        (270, [("inc-1", False)]),
        # inc-1 was sent 300 s ago: no longer re-sent.
    ]
    assert value(h.telemetry, "trainmedic_notifications_total", sink="alertmanager", outcome="resent") == 6


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_a_real_alertmanager_shows_the_incident_active_then_resolved(tmp_path: Path) -> None:
    require_alertmanager()
    telemetry = Telemetry()
    async with AlertmanagerServer() as am:
        outbox = Outbox(tmp_path / "trainmedic.db")
        n = Notifier(
            NotifySettings(sinks=[SinkSettings(kind="alertmanager", url=am.url)]),
            outbox=outbox,
            store=None,
            telemetry=telemetry,
        )
        stop = asyncio.Event()
        task = asyncio.create_task(n.run(stop))
        try:
            await n.enqueue(incident_event("inc-am", "blocked", at=time.time()))

            def ours(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
                return [a for a in alerts if a["labels"].get("incident") == "inc-am"]

            alerts = ours(await am.wait_for_alerts(lambda al: len(ours(al)) == 1))
            (alert,) = alerts
            assert alert["status"]["state"] == "active"
            assert alert["labels"]["fault_class"] == "device_error"
            assert alert["labels"]["severity"] == "critical"
            assert alert["annotations"]["status"] == "blocked"
            await n.enqueue(incident_event("inc-am", "resolved", at=time.time()))
            # Resolved: Alertmanager no longer lists it among the alerts it holds as firing.
            await am.wait_for_alerts(lambda al: not ours(al))
        finally:
            stop.set()
            await task
            await n.aclose()
            outbox.close()
    assert value(telemetry, "trainmedic_notifications_total", sink="alertmanager", outcome="delivered") == 2


# -- grouping and rate limits ---------------------------------------------------------------------------


def _digest_count(r: Request) -> int:
    return int(r.header("x-trainmedic-dedup-count") or 0)


@pytest.mark.looptime
@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["cloudevents", "feishu", "dingtalk", "wecom", "slack"])
async def test_a_500_node_outage_is_a_handful_of_messages(h: Harness, kind: str) -> None:
    h.rx.default = Reply(200, OK_BODY[kind])
    n = await h.start(sink(kind, h.rx.url, burst=5, window_s=60))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for i in range(500):
        await n.enqueue(incident_event(f"inc-{i:03d}", "failed"))
    await h.settled(n, 500)
    reqs = h.rx.accepted
    # Five notices one by one at once, then everything else in one digest when the next token is due.
    assert [_digest_count(r) for r in reqs] == [1, 1, 1, 1, 1, 495]
    assert all(r.loop_time - t0 < 0.5 for r in reqs[:5])
    assert reqs[5].loop_time - t0 == pytest.approx(12, abs=0.5)
    if kind == "cloudevents":
        assert reqs[5].header("content-type") == "application/cloudevents-batch+json; charset=utf-8"
        ids = [e["id"] for r in reqs for e in ([r.json()] if _digest_count(r) == 1 else r.json())]
        assert sorted(ids) == sorted(f"inc-{i:03d}/failed" for i in range(500))
    # The storm is over; later, all 500 resolve: again a handful.
    await asyncio.sleep(300)
    for i in range(500):
        await n.enqueue(incident_event(f"inc-{i:03d}", "resolved"))
    await h.settled(n, 1000)
    assert [_digest_count(r) for r in h.rx.accepted[6:]] == [1, 1, 1, 1, 1, 495]
    assert len(h.rx.requests) == 12
    assert all(i.state is ItemState.DELIVERED for i in n.outbox.items())


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_spread_out_storm_sends_one_digest_per_window(h: Harness) -> None:
    n = await h.start(sink("cloudevents", h.rx.url, burst=5, window_s=60))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    # 300 incidents, one a second for five minutes.
    for i in range(300):
        await n.enqueue(incident_event(f"inc-{i:03d}", "acting"))
        await asyncio.sleep(1)
    await h.settled(n, 300)
    reqs = h.rx.accepted
    singles = [r for r in reqs if _digest_count(r) == 1]
    digests = [r for r in reqs if _digest_count(r) > 1]
    assert len(singles) == 5
    assert sum(_digest_count(r) for r in digests) == 295
    # After the burst: one message a window (the first when the next token is due).
    times = [r.loop_time - t0 for r in digests]
    assert all(b - a == pytest.approx(60, abs=0.5) for a, b in itertools.pairwise(times)), times
    assert len(reqs) <= 11


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_alertmanager_gets_everything_pending_in_one_post(h: Harness) -> None:
    n = await h.start(sink("alertmanager", h.rx.url))
    for i in range(500):
        await n.enqueue(incident_event(f"inc-{i:03d}", "failed"))
    await h.settled(n, 500)
    (post,) = h.rx.accepted
    assert len(post.json()) == 500


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_flush_sends_what_the_rate_limit_holds_back(h: Harness) -> None:
    n = h.track(h.notifier(sink("cloudevents", h.rx.url, burst=1, window_s=3600)))
    for i in range(3):
        await n.enqueue(incident_event(f"inc-{i}", "acting"))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await n.flush(5)
    assert loop.time() - t0 < 1
    assert [_digest_count(r) for r in h.rx.accepted] == [1, 2]
    assert n.outbox.depth() == 0


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_flush_returns_in_time_when_the_receiver_is_down(h: Harness) -> None:
    await h.rx.stop()
    n = h.track(h.notifier(sink("cloudevents", h.rx.url)))
    await n.enqueue(incident_event("inc-1"))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await n.flush(5)
    assert loop.time() - t0 <= 5
    assert n.outbox.depth() == 1


# -- restarts -------------------------------------------------------------------------------------------


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_new_notifier_over_the_same_file_delivers_what_was_pending(h: Harness) -> None:
    await h.rx.stop()
    first = await h.start(sink("cloudevents", h.rx.url))
    for i in range(3):
        await first.enqueue(incident_event(f"inc-{i}", "blocked"))
    await asyncio.sleep(30)
    await h.kill(first)
    await h.rx.start()
    second = await h.start(sink("cloudevents", h.rx.url))
    await h.settled(second, 3)
    assert keys(h.rx.accepted) == ["inc-0/blocked", "inc-1/blocked", "inc-2/blocked"]
    # The replay of the same incident events after the restart queues nothing new.
    await second.enqueue(incident_event("inc-0", "blocked"))
    await asyncio.sleep(60)
    assert len(h.rx.requests) == 3


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_notice_in_flight_when_the_agent_died_is_sent_again(h: Harness) -> None:
    h.rx.script(Reply(delay_s=3600))  # the receiver got the body; the answer never comes back
    first = await h.start(sink("cloudevents", h.rx.url, timeout_s=300))
    await first.enqueue(incident_event("inc-1", "failed"))
    await h.rx.wait_for(1, accepted=False)
    await h.kill(first)
    second = await h.start(sink("cloudevents", h.rx.url))
    await h.settled(second, 1)
    # At least once: the receiver saw it twice, both times with the same dedup key.
    assert keys(h.rx.requests) == ["inc-1/failed", "inc-1/failed"]


# -- secrets ---------------------------------------------------------------------------------------------


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_secrets_and_robot_urls_never_reach_logs_errors_or_timelines(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="trainmedic")
    h.incident("inc-1")
    h.incident("inc-2")
    h.rx.script(Reply(500, b"oops"), Reply(401, {"errcode": 400, "errmsg": "bad token"}))
    url = h.rx.url + "/robot/send?access_token=TOPSECRETTOKEN"
    n = await h.start(
        sink("dingtalk", url, secret_env="DING_SECRET", headers={"X-Auth": "HEADERSECRET"}),
        env={"DING_SECRET": "SECRETSIGNINGKEY"},
    )
    await n.enqueue(incident_event("inc-1", "failed"))
    await h.settled(n, 1)
    await h.rx.stop()  # and a connection error
    await n.enqueue(incident_event("inc-2", "failed"))
    await asyncio.sleep(30)
    await h.close()
    assert h.rx.requests[0].header("x-auth") == "HEADERSECRET"
    recorded = [
        caplog.text,
        json.dumps([h.store.timeline("inc-1"), h.store.timeline("inc-2")]),
        json.dumps([(i.last_error, i.detail) for i in Outbox(h.path).items()]),
    ]
    for text in recorded:
        for secret in ("TOPSECRETTOKEN", "SECRETSIGNINGKEY", "HEADERSECRET"):
            assert secret not in text, text[:2000]
    assert "notify sink dingtalk" in caplog.text
    assert "bad token" in recorded[1]


def test_a_configured_secret_is_hidden_in_the_settings() -> None:
    settings = NotifySettings.model_validate(
        {
            "sinks": [
                {"kind": "cloudevents", "url": "https://x", "secret": "SECRETVALUE", "headers": {"A": "SECRETVALUE"}}
            ]
        }
    )
    assert "SECRETVALUE" not in repr(settings)
    assert "SECRETVALUE" not in str(settings.model_dump())
    assert "SECRETVALUE" not in settings.model_dump_json()


# -- the receiver itself ---------------------------------------------------------------------------------


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_threaded_receiver_records_scripts_and_goes_down() -> None:
    import urllib.error

    with ThreadedReceiver(default=Reply(200, {"ok": True})) as rx:
        rx.script(Reply(503, "busy", retry_after=7))
        assert _post(rx.url + "/a?x=1", b'{"n": 1}') == (503, b"busy")
        assert _post(rx.url + "/a", b'{"n": 2}') == (200, b'{"ok": true}')
        (req,) = rx.wait_for(1)
        assert (req.path, req.json(), req.status) == ("/a", {"n": 2}, 200)
        assert rx.requests[0].query == {"x": ["1"]}
        rx.stop()
        with pytest.raises(urllib.error.URLError):
            _post(rx.url, b"{}")


# -- settings --------------------------------------------------------------------------------------------


def test_sink_defaults_depend_on_the_kind() -> None:
    chat = SinkSettings(kind="dingtalk", url="https://oapi.dingtalk.com/robot/send?access_token=x")
    ce = SinkSettings(kind="cloudevents", url="https://ops.example/hooks/trainmedic")
    assert (chat.sink_name, chat.effective_burst, ce.effective_burst) == ("dingtalk", 3, 5)
    assert "acting" not in chat.effective_statuses and "resolved" in chat.effective_statuses
    assert "acting" in ce.effective_statuses


@pytest.mark.parametrize(
    ("sinks", "problem"),
    [
        ([{"kind": "cloudevents", "url": "ftp://x"}], "http:// or https://"),
        ([{"kind": "wecom", "url": "https://qyapi.weixin.qq.com/x", "secret": "s"}], "not signed"),
        ([{"kind": "cloudevents", "url": "https://x", "secret": "a", "secret_env": "B"}], "not both"),
        ([{"kind": "slack", "url": "https://x", "statuses": ["resolved", "exploded"]}], "unknown statuses"),
        ([{"kind": "slack", "url": "https://x"}, {"kind": "slack", "url": "https://y"}], "unique"),
        ([{"kind": "pagerduty", "url": "https://x"}], "kind"),
        ([{"kind": "slack", "url": "https://x", "burst": 0}], "burst"),
    ],
)
def test_invalid_sinks_are_refused_with_the_reason(sinks: list[dict[str, Any]], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        NotifySettings.model_validate({"sinks": sinks})


def test_notify_settings_come_from_the_config_file_and_the_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "trainmedic.yaml"
    cfg.write_text(
        "notify:\n  sinks:\n    - {kind: cloudevents, url: 'https://ops.example/hook', secret_env: CE_SECRET}\n"
        "    - {kind: feishu, name: oncall, url: 'https://open.feishu.cn/open-apis/bot/v2/hook/x', lang: zh}\n"
    )
    s = load_settings(cfg, env={"TRAINMEDIC_NOTIFY__SOURCE": "//cluster-a", "TRAINMEDIC_NOTIFY__RETRY_MAX_S": "60"})
    assert [k.sink_name for k in s.notify.sinks] == ["cloudevents", "oncall"]
    assert (s.notify.source, s.notify.retry_max_s) == ("//cluster-a", 60)
    assert Settings().notify.sinks == []


def test_a_missing_secret_env_refuses_to_build_the_notifier(tmp_path: Path) -> None:
    settings = NotifySettings(sinks=[SinkSettings(kind="cloudevents", url="https://x", secret_env="NOPE_SECRET")])
    with Outbox(tmp_path / "db") as ob, pytest.raises(NotifyError, match="NOPE_SECRET"):
        Notifier(settings, outbox=ob, store=None, telemetry=Telemetry(), env={})


def test_a_digest_key_is_stable_and_order_free() -> None:
    from trainmedic.reports.notice import Notice

    a = Notice.from_incident_event(incident_event("inc-1"))
    b = Notice.from_incident_event(incident_event("inc-2"))
    assert dedup_key_of([a]) == "inc-1/acting"
    assert dedup_key_of([a, b]) == dedup_key_of([b, a]) != dedup_key_of([a])


# -- the agent: responder -> notifier -> receiver -----------------------------------------------------------


@pytest_asyncio.fixture
async def kube() -> AsyncIterator[KubeEmulator]:
    require_kmock()
    async with KubeEmulator() as k:
        yield k


def _agent_settings(tmp: Path, sinks: list[dict[str, Any]], **notify: Any) -> Settings:
    return Settings.model_validate(
        {
            "node_name": "brain-0",
            "kubernetes": {"workloads": False},
            "logs": {"enabled": False},
            "kernel": {"source": "off"},
            "metrics": {"nvml": False},
            "remediate": {"store": str(tmp / "trainmedic.db"), "scene_dir": str(tmp / "scenes")},
            "api": {"enabled": False},
            "notify": {"sinks": sinks, **notify},
        }
    )


@pytest.mark.asyncio
async def test_build_agent_wires_the_notifier_to_the_responder_and_the_store_file(
    tmp_path: Path, kube: KubeEmulator
) -> None:
    s = _agent_settings(tmp_path, [sink("cloudevents", "http://127.0.0.1:9/hook")])
    agent = build_agent(s, Role.BRAIN, bus=MemoryBus(), api_client=kube.api_client())
    try:
        assert agent.notifier is not None and "notifier" in agent.components
        assert agent.responder.notifier is agent.notifier
        assert agent.notifier.outbox.path == s.remediate.store
        assert agent.notifier.store is agent.responder.store
    finally:
        await agent.notifier.aclose()
        agent.notifier.outbox.close()
        agent.responder.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("sinks", "reason"),
    [([], "notify.sinks is empty"), ([sink("cloudevents", "http://x", secret_env="NO_SUCH_SECRET_ENV")], "NO_SUCH")],
)
async def test_without_usable_sinks_the_agent_runs_without_a_notifier(
    tmp_path: Path, kube: KubeEmulator, sinks: list[dict[str, Any]], reason: str
) -> None:
    agent = build_agent(_agent_settings(tmp_path, sinks), Role.BRAIN, bus=MemoryBus(), api_client=kube.api_client())
    try:
        assert agent.notifier is None and agent.responder.notifier is None
        assert reason in agent.disabled["notifier"]
    finally:
        agent.responder.close()


def _diagnosis(diagnosis_id: str) -> DiagnosisEvent:
    rc = root_cause()
    finding = Finding(
        rule_id=rc.rule_id,
        fault_class=rc.fault_class,
        chip=rc.chip,
        code=rc.code,
        source=Source.KERNEL,
        severity=Severity.CRITICAL,
        text="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        node="gpu-node-a",
        timestamp=time.time(),
    )
    return DiagnosisEvent(
        diagnosis_id=diagnosis_id,
        final=True,
        node="gpu-node-a",
        window_start=time.time() - 30,
        window_end=time.time(),
        diagnosis=Diagnosis(root_cause=rc, findings=[finding]),
    )


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_an_incident_from_the_responder_reaches_every_sink_and_its_timeline(
    tmp_path: Path, kube: KubeEmulator
) -> None:
    async with Receiver(default=Reply(200, {"code": 0, "errcode": 0})) as rx:
        s = _agent_settings(
            tmp_path,
            [sink("cloudevents", rx.url + "/ce", secret=SECRET), sink("feishu", rx.url + "/feishu")],
        )
        bus = MemoryBus(partitions=2)
        agent = build_agent(s, Role.BRAIN, bus=bus, api_client=kube.api_client())
        assert agent.notifier is not None, agent.disabled
        task = asyncio.create_task(run_agent(agent, drain_timeout_s=10))
        try:
            await asyncio.wait_for(agent.responder.ready.wait(), 10)
            d = _diagnosis("diag-xid79")
            await bus.publish(Topic.DIAGNOSES, make_event(d, producer="brain/test", key="node:gpu-node-a"))
            # The machine sink hears of the incident at once (open) and again when it settles; the
            # chat robot only when it settles (its default statuses).
            ce = await rx.wait_for(2, timeout=30, path="/ce")
            await rx.wait_for(1, timeout=30, path="/feishu")
        finally:
            agent.stop.set()
            await asyncio.wait_for(task, 30)
        assert [r.json()["type"] for r in ce] == ["io.trainmedic.incident.open", "io.trainmedic.incident.observed"]
        by_path = {r.path: r for r in rx.accepted}
        event = by_path["/ce"].json()
        assert event["subject"] == "diag-xid79"
        assert event["data"]["code"] == "xid:79" and event["data"]["node"] == "gpu-node-a"
        assert payloads.verify(SECRET.encode(), by_path["/ce"].headers, by_path["/ce"].body, now=time.time())
        assert by_path["/feishu"].json()["msg_type"] == "interactive"
        store = IncidentStore(s.remediate.store)
        try:
            notes = [e["detail"]["sink"] for e in store.timeline("diag-xid79") if e["kind"] == "notified"]
        finally:
            store.close()
        assert sorted(notes) == ["cloudevents", "cloudevents", "feishu"]


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The notifier honours the proxy variables (egress to the chat robots often needs one); a
    # developer's proxy setting must not reroute the tests' loopback requests.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_on_shutdown_the_agent_flushes_what_the_rate_limit_held_back(tmp_path: Path, kube: KubeEmulator) -> None:
    async with Receiver(default=Reply(200, {"errcode": 0})) as rx:
        s = _agent_settings(tmp_path, [sink("wecom", rx.url + "/wecom", burst=1, window_s=3600)])
        bus = MemoryBus(partitions=2)
        agent = build_agent(s, Role.BRAIN, bus=bus, api_client=kube.api_client())
        task = asyncio.create_task(run_agent(agent, drain_timeout_s=10))
        try:
            await asyncio.wait_for(agent.responder.ready.wait(), 10)
            for i in range(3):
                d = _diagnosis(f"diag-{i}")
                await bus.publish(Topic.DIAGNOSES, make_event(d, producer="brain/test", key=f"node:n{i}"))
            await rx.wait_for(1)
            async with asyncio.timeout(30):
                while len(agent.responder.handled) < 3:
                    await asyncio.sleep(0.05)
            assert len(rx.accepted) == 1  # one token an hour: the other two wait for a digest
        finally:
            agent.stop.set()
            await asyncio.wait_for(task, 30)
        assert [r.header("x-trainmedic-dedup-count") for r in rx.accepted] == ["1", "2"]
        with Outbox(s.remediate.store) as ob:
            assert ob.counts() == {"pending": 0, "delivered": 3, "dead": 0}


# -- credentials in URLs never reach a log ---------------------------------------------------------


@pytest.mark.parametrize("status", [200, 404, 500])
@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("slack", "/services/T0SECRET1/B0SECRET2/HOOKSECRETHOOKSECRET"),
        ("cloudevents", "/hook?token=QUERYSECRET&sig=QUERYSIG"),
        ("feishu", "/open-apis/bot/v2/hook/HOOKSECRET-1234"),
    ],
)
@pytest.mark.looptime
@pytest.mark.asyncio
async def test_no_logger_prints_url_credentials_across_a_real_delivery(
    h: Harness, caplog: pytest.LogCaptureFixture, kind: str, path: str, status: int
) -> None:
    caplog.set_level(logging.DEBUG)  # the root logger, every logger under it
    h.rx.default = Reply(status, OK_BODY[kind] if status == 200 else {"error": "x"})
    host = h.rx.url.split("://", 1)[1]
    url = f"http://hookuser:PASSWORDSECRET@{host}{path}"
    extra = {"secret": SECRET} if kind in ("cloudevents", "feishu") else {}
    n = await h.start(sink(kind, url, **extra), retry_initial_s=1, retry_max_s=2)
    await n.enqueue(incident_event("inc-1", "failed"))
    await h.rx.wait_for(1, accepted=False)
    await asyncio.sleep(0.2)  # the answer is read and logged
    text = caplog.text + "\n".join(r.getMessage() for r in caplog.records)
    assert "HTTP Request" in text or "delivered" in text or "refused" in text or "retrying" in text
    for secret in ("PASSWORDSECRET", "hookuser", "QUERYSECRET", "QUERYSIG", "HOOKSECRET", "T0SECRET1"):
        assert secret not in text, f"{secret} was logged"
    h.rx.default = Reply(200, OK_BODY[kind])  # let the retries end so the notifier stops at once


# -- storms with the shipped defaults --------------------------------------------------------------


def node_incident(i: int, status: str) -> Event:
    payload = IncidentEvent(
        incident_id=f"inc-{i:03d}",
        status=status,
        job=JobRef(namespace="train", name=f"job-{i % 250:03d}"),  # 500 nodes, 250 two-node jobs
        node=f"gpu-{i:03d}",
        root_cause=root_cause(f"gpu-{i:03d}"),
        mode="enforce",
    )
    return make_event(payload, producer="brain/test", at=BASE)


@pytest.mark.looptime
@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["cloudevents", "feishu", "dingtalk", "wecom", "slack"])
async def test_a_500_node_outage_is_at_most_10_messages_a_sink_with_the_shipped_defaults(h: Harness, kind: str) -> None:
    """No burst or window set: the defaults. Every incident of the outage goes open -> acting at once,
    then ends (failed or resolved) over the next minutes."""
    h.rx.default = Reply(200, OK_BODY[kind])
    extra = {"secret": SECRET} if kind in ("cloudevents", "feishu", "dingtalk") else {}
    n = await h.start(sink(kind, h.rx.url, **extra))
    for status in ("open", "acting"):
        for i in range(500):
            await n.enqueue(node_incident(i, status))
        await asyncio.sleep(2)
    await asyncio.sleep(60)
    for i in range(500):
        await n.enqueue(node_incident(i, "failed" if i % 2 else "resolved"))
        await asyncio.sleep(0.18)
    queued = n.outbox.counts()
    await h.settled(n, sum(queued.values()))
    reqs = h.rx.accepted
    assert len(reqs) <= 10, [_digest_count(r) for r in reqs]
    assert sum(_digest_count(r) for r in reqs) == sum(queued.values())
    digests = [r for r in reqs if _digest_count(r) > 1]
    assert digests
    for r in digests:
        # A digest names how many nodes and jobs the outage touches.
        assert int(r.header("x-trainmedic-affected-nodes") or 0) > 1
        assert int(r.header("x-trainmedic-affected-jobs") or 0) > 1
        if kind != "cloudevents":
            assert "nodes and" in r.body.decode() and "jobs affected" in r.body.decode()


# -- a sink that fails for good: the incident still reaches a person through the others --------------------


@pytest.mark.looptime
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("failing", "reason", "error", "other_statuses"),
    [
        pytest.param(Reply(404, "no_service"), "refused", "HTTP 404: no_service", None, id="4xx"),
        pytest.param(Reply(503, "down"), "gave_up", "gave up after 300 s: HTTP 503: down", None, id="gave-up"),
        pytest.param(Reply(404, "no_service"), "refused", "HTTP 404: no_service", ["resolved"], id="other-status"),
    ],
)  # fmt: skip
async def test_a_sink_that_fails_for_good_is_paged_through_the_others(
    h: Harness, failing: Reply, reason: str, error: str, other_statuses: list[str] | None
) -> None:
    h.incident("inc-1")
    h.rx.default = failing
    async with Receiver() as other:
        other.default = Reply(202, b"")
        ce = sink("cloudevents", other.url, **({"statuses": other_statuses} if other_statuses else {}))
        n = await h.start(sink("slack", h.rx.url), ce, retry_initial_s=1, retry_max_s=30, give_up_after_s=300)
        await n.enqueue(incident_event("inc-1", "blocked"))
        expected = 1 + (other_statuses is None)  # the failure page, and the notice itself when it takes it
        await h.settled(n, expected + 1)
        await asyncio.sleep(600)
        pages = [r.json() for r in other.requests]
    assert len(pages) == expected
    page = pages[-1]
    assert page["type"] == "io.trainmedic.incident.notification_failed"
    assert page["data"]["failed_sink"] == "slack" and page["data"]["severity"] == "critical"
    assert page["data"]["incident_id"] == "inc-1" and page["data"]["status"] == "blocked"
    assert page["data"]["summary"]["en"].startswith(f"Notification sink slack failed permanently: {error}. ")
    assert page["data"]["summary"]["zh"].startswith(f"通知渠道 slack 永久投递失败：{error}。")
    assert "GPU has fallen off the bus" in page["data"]["summary"]["en"]
    (note,) = h.timeline("inc-1", "notify_escalated")
    assert note["failed_sink"] == "slack" and note["to"] == ["cloudevents"] and note["error"] == error
    assert value(h.telemetry, "trainmedic_notify_sink_failed_total", sink="slack", reason=reason) == 1
    assert value(h.telemetry, "trainmedic_notify_sink_failed_total", sink="cloudevents", reason=reason) == 0


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_failure_pages_that_fail_are_counted_not_paged_again(h: Harness) -> None:
    """Both sinks refuse everything: each gets the notice and the other's failure page, once; nothing loops."""
    h.incident("inc-1")
    h.rx.default = Reply(404, "no_service")
    async with Receiver() as other:
        other.default = Reply(404, "no_service")
        n = await h.start(sink("slack", h.rx.url), sink("cloudevents", other.url))
        await n.enqueue(incident_event("inc-1", "blocked"))
        await h.settled(n, 4)
        await asyncio.sleep(3600)
        assert len(other.requests) == 2
    assert len(h.rx.requests) == 2
    for name in ("slack", "cloudevents"):
        assert value(h.telemetry, "trainmedic_notify_sink_failed_total", sink=name, reason="refused") == 2
    assert sorted(e["failed_sink"] for e in h.timeline("inc-1", "notify_escalated")) == ["cloudevents", "slack"]


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_with_no_other_sink_the_failure_is_noted_and_counted(h: Harness) -> None:
    h.incident("inc-1")
    h.rx.default = Reply(410, "gone")
    n = await h.start(sink("slack", h.rx.url))
    await n.enqueue(incident_event("inc-1", "blocked"))
    await h.settled(n, 1)
    (note,) = h.timeline("inc-1", "notify_escalated")
    assert note["to"] == [] and note["failed_sink"] == "slack"
    assert value(h.telemetry, "trainmedic_notify_sink_failed_total", sink="slack", reason="refused") == 1


def test_a_failure_page_is_an_alert_and_a_chat_title_of_its_own() -> None:
    notice = Notice.from_incident_event(incident_event("inc-1", "resolved"))
    page = notice.sink_failure("feishu", "HTTP 400: sign match fail", at=BASE + 5)
    assert page.dedup_key == "inc-1/resolved/sink-failed:feishu" != notice.dedup_key
    alerts = payloads.alertmanager_alerts([notice, page], now=BASE + 10)
    by_name = {a["labels"]["alertname"]: a for a in alerts}
    assert set(by_name) == {"TrainmedicIncident", "TrainmedicNotificationFailed"}
    failed = by_name["TrainmedicNotificationFailed"]
    assert failed["labels"]["failed_sink"] == "feishu" and "endsAt" not in failed  # firing: a person must see it
    assert "endsAt" in by_name["TrainmedicIncident"]
    text = json.dumps(payloads.slack_message([page], lang="both"), ensure_ascii=False)
    assert "sink feishu failed permanently" in text and "通知渠道 feishu 永久投递失败" in text


def test_a_failure_page_leaves_the_single_use_approve_link_behind() -> None:
    notice = Notice.from_incident_event(
        incident_event("inc-1", "awaiting_approval"),
        incident_url="https://trainmedic.example/console/incidents/inc-1",
        approve_url="https://trainmedic.example/console/approve/inc-1?sig=one-time",
    )
    page = notice.sink_failure("slack", "HTTP 404: no_service", at=BASE)
    assert page.approve_url is None and page.incident_url == notice.incident_url
    assert "one-time" not in json.dumps(page.as_dict()) and page.as_dict()["failed_sink"] == "slack"
    assert Notice.from_dict(page.as_dict()) == page


@pytest.mark.looptime
@pytest.mark.asyncio
@pytest.mark.parametrize(("lang", "text"), [("en", "Sink failed for good"), ("zh", "通知渠道永久失败")])
async def test_the_report_timeline_names_the_page_through_the_other_sinks(h: Harness, lang: str, text: str) -> None:
    from trainmedic.agent.reporting import render_incident

    h.incident("inc-1")
    h.rx.default = Reply(404, "no_service")
    async with Receiver() as other:
        n = await h.start(sink("slack", h.rx.url), sink("cloudevents", other.url))
        await n.enqueue(incident_event("inc-1", "blocked"))
        await h.settled(n, 3)
    assert text in render_incident(h.store, "inc-1", fmt="md", lang=lang)
