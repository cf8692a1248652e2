"""`Notifier`: notices committed in the outbox, delivered by one loop per sink with its token bucket
(a notice alone while tokens last, digests in a storm), retries with backoff, give-ups and the
escalation of a notice one sink will never deliver to the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from trainmedic.agent.config import NotifySettings
from trainmedic.agent.notify.sinks import (
    MAX_RESPONSE_BYTES,
    SINK_TYPES,
    Message,
    NotifyError,
    Outcome,
    Sink,
    backoff_delay,
    resolve_secret,
)
from trainmedic.agent.outbox import Outbox, OutboxError, OutboxItem
from trainmedic.agent.store import IncidentStore, StoreError
from trainmedic.agent.telemetry import Telemetry
from trainmedic.errors import PermanentError
from trainmedic.events import Event, IncidentEvent
from trainmedic.reports.notice import Notice, NoticeError

log = logging.getLogger("trainmedic.notify")


# -- the notifier -----------------------------------------------------------------------------------


@dataclass
class _Runner:
    """One sink's delivery state: its token bucket, digest mode and backoff."""

    sink: Sink
    client: httpx.AsyncClient
    tokens: float
    refilled: float
    # While set, the sink is in digest mode: the next message (everything pending) goes at this time.
    digest_at: float | None = None
    paused_until: float = 0.0
    failures: int = 0
    # When firing alerts are next re-sent (resending sinks); 0: at the first idle moment.
    resend_at: float = 0.0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task[float | None] | None = None

    def refill(self, now: float) -> None:
        rate = self.sink.burst / self.sink.window_s
        self.tokens = min(float(self.sink.burst), self.tokens + max(0.0, now - self.refilled) * rate)
        self.refilled = now

    def next_token(self, now: float) -> float:
        return now + max(0.0, 1.0 - self.tokens) * self.sink.window_s / self.sink.burst


class Notifier:
    """Owns the sinks built from NotifySettings and delivers the outbox to them."""

    def __init__(
        self,
        settings: NotifySettings,
        *,
        outbox: Outbox,
        store: IncidentStore | None,
        telemetry: Telemetry,
        clock: Callable[[], float] = time.time,
        report_url: Callable[[str], str | None] | None = None,
        rng: random.Random | None = None,
        env: Mapping[str, str] | None = None,
        incident_url: Callable[[str], str | None] | None = None,
        approve_url: Callable[[str, float], str | None] | None = None,
        reject_url: Callable[[str, float], str | None] | None = None,
    ) -> None:
        self.settings = settings
        self.outbox = outbox
        self.store = store
        self.telemetry = telemetry
        self.clock = clock
        self.report_url = report_url
        # The console's incident page, and the signed approve and reject links for a plan awaiting
        # approval (agent/console/security.py); made once, when the notice is queued, so a re-send
        # carries the same.
        self.incident_url = incident_url
        self.approve_url = approve_url
        self.reject_url = reject_url
        self.rng = rng or random.Random()  # noqa: S311 (jitter, not cryptography)
        self.sinks: list[Sink] = []
        problems = []
        if settings.enabled:
            for s in settings.sinks:
                try:
                    secret = resolve_secret(s, env)
                except NotifyError as e:
                    problems.append(str(e))
                    continue
                self.sinks.append(SINK_TYPES[s.kind](s, secret=secret, source=settings.source))
        if problems:
            raise NotifyError("; ".join(problems))
        self._runners: dict[str, _Runner] = {}

    # -- queueing -------------------------------------------------------------------------------------

    async def enqueue(self, event: Event) -> None:
        """An IncidentEvent becomes one outbox row per interested sink, committed before this returns.

        Never raises: a notice that cannot be built or stored is logged (and counted) as lost, so the
        responder's own work goes on."""
        if not isinstance(event.payload, IncidentEvent) or not self.sinks:
            return
        incident_id = event.payload.incident_id
        try:
            url = self.report_url(incident_id) if self.report_url is not None else None
            page = self.incident_url(incident_id) if self.incident_url is not None else None
            approve = reject = None
            if event.payload.status == "awaiting_approval":
                now = self.clock()
                approve = self.approve_url(incident_id, now) if self.approve_url is not None else None
                reject = self.reject_url(incident_id, now) if self.reject_url is not None else None
            notice = Notice.from_incident_event(
                event, report_url=url, incident_url=page, approve_url=approve, reject_url=reject
            )
        except (NoticeError, ValueError) as e:
            log.error("incident %s: cannot build a notice (%s); it is not sent", incident_id, e)
            return
        targets = [s for s in self.sinks if notice.status in s.statuses]
        if not targets:
            return
        try:
            added = set(self.outbox.enqueue_many([s.name for s in targets], notice))
        except (OutboxError, sqlite3.Error) as e:
            log.error("incident %s: notice %s could not be stored in the outbox: %s", incident_id, notice.dedup_key, e)
            for s in targets:
                self.telemetry.notifications.labels(s.name, "enqueue_failed").inc()
            return
        for s in targets:
            if s.name in added:
                self.telemetry.notifications.labels(s.name, "queued").inc()
                self.telemetry.outbox_depth.labels(s.name).inc()
                runner = self._runners.get(s.name)
                if runner is not None:
                    runner.wake.set()
            else:
                self.telemetry.notifications.labels(s.name, "duplicate").inc()

    # -- delivery loops -------------------------------------------------------------------------------

    def _runner(self, sink: Sink) -> _Runner:
        runner = self._runners.get(sink.name)
        if runner is None:
            client = httpx.AsyncClient(verify=sink.settings.tls_verify, follow_redirects=False)
            runner = _Runner(sink=sink, client=client, tokens=float(sink.burst), refilled=self.clock())
            self._runners[sink.name] = runner
        return runner

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until `stop` is set: one loop per sink, each woken by enqueue or by its next due time."""
        if not self.sinks:
            await stop.wait()
            return
        for name, count in self.outbox.sinks_pending().items():
            if name not in {s.name for s in self.sinks}:
                log.warning("outbox: %d notices wait for sink %s, which is no longer configured", count, name)
        loops = [
            asyncio.create_task(self._loop(self._runner(s), stop), name=f"trainmedic:notify:{s.name}")
            for s in self.sinks
        ]
        try:
            await asyncio.gather(*loops)
        finally:
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    async def _loop(self, r: _Runner, stop: asyncio.Event) -> None:
        self._gauge(r.sink)
        while not stop.is_set():
            r.wake.clear()
            try:
                if r.task is None or r.task.done():
                    r.task = asyncio.create_task(self._pump(r), name=f"trainmedic:notify:{r.sink.name}:send")
                # A send in flight finishes even when this loop is cancelled (shutdown); flush waits for it.
                nxt = await asyncio.shield(r.task)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("notify sink %s: delivery pass failed; retrying", r.sink.name)
                nxt = self.clock() + self.settings.retry_initial_s
            timeout = None if nxt is None else max(0.0, nxt - self.clock())
            await _wait_any(r.wake, stop, timeout)

    async def flush(self, timeout_s: float) -> None:
        """Deliver what is due now, ignoring rate limits (shutdown, the demo, the benchmark); returns
        when nothing due is left or after `timeout_s`. What fails stays queued for the next run."""
        if not self.sinks:
            return

        async def one(r: _Runner) -> None:
            if r.task is not None and not r.task.done():
                with contextlib.suppress(Exception):
                    await asyncio.shield(r.task)
            await self._pump(r, flush=True)

        runners = [self._runner(s) for s in self.sinks]
        tasks = [asyncio.create_task(one(r)) for r in runners]
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                log.error("notify: flush failed: %s", t.exception())
        if pending:
            log.warning("notify: flush stopped after %.1f s; %d notices stay queued", timeout_s, self.outbox.depth())

    async def aclose(self) -> None:
        """Cancel what is in flight (it stays queued) and close the HTTP clients."""
        for r in self._runners.values():
            if r.task is not None and not r.task.done():
                r.task.cancel()
        await asyncio.gather(*(r.task for r in self._runners.values() if r.task is not None), return_exceptions=True)
        for r in self._runners.values():
            await r.client.aclose()
        self._runners.clear()

    # -- one sink's pass ------------------------------------------------------------------------------

    async def _pump(self, r: _Runner, *, flush: bool = False) -> float | None:
        """Send what the rate limit allows now; the time of the next thing to do (None: wait for enqueue)."""
        sink = r.sink
        async with r.lock:
            while True:
                now = self.clock()
                if now < r.paused_until:
                    return r.paused_until
                items = self.outbox.due(sink.name, now=now, limit=sink.max_batch)
                if not items:
                    if r.digest_at is not None and now >= r.digest_at:
                        r.digest_at = None  # a window with nothing to send: the storm is over
                    resend_at = None
                    if sink.resend_s > 0 and not flush:
                        if now >= r.resend_at:
                            await self._resend(r, now)
                            r.resend_at = self.clock() + sink.resend_s
                        resend_at = r.resend_at
                    return _earliest(self.outbox.next_due(sink.name), r.digest_at, resend_at)
                r.refill(now)
                digest = False
                if sink.batches_always:
                    if r.tokens < 1 and not flush:
                        return r.next_token(now)
                    batch = items
                elif r.digest_at is None and r.tokens >= 1:
                    batch = items[:1]
                else:
                    if r.digest_at is None:
                        r.digest_at = r.next_token(now)
                        log.info(
                            "notify sink %s: more than %d messages in %.0f s; merging notices into digests",
                            sink.name,
                            sink.burst,
                            sink.window_s,
                        )
                    if now < r.digest_at and not flush:
                        return r.digest_at
                    batch, digest = items, True
                r.tokens = max(0.0, r.tokens - 1.0)
                outcome = await self._send(r, batch)
                if outcome.result == "retry" and outcome.http is None:
                    # Nothing reached the receiver (connection refused, timeout): no message was spent.
                    r.tokens = min(float(sink.burst), r.tokens + 1.0)
                if digest and outcome.result != "retry":
                    r.digest_at = self.clock() + sink.window_s

    async def _resend(self, r: _Runner, now: float) -> None:
        """Send the latest state of every incident still firing again (what was delivered stays so)."""
        sink = r.sink
        items = self.outbox.latest_delivered(sink.name, since=now - sink.resend_for_s, limit=sink.max_batch)
        notices = [i.notice for i in items if i.notice.firing]
        if not notices:
            return
        try:
            msg = sink.build(notices, now=now)
        except Exception:
            log.exception("notify sink %s: cannot build the re-sent alerts", sink.name)
            return
        outcome = await self._post(r, msg, now=now)
        if outcome.result == "delivered":
            self.telemetry.notifications.labels(sink.name, "resent").inc(len(notices))
        else:
            self.telemetry.webhook_failures.labels(sink.name).inc()
            log.warning(
                "notify sink %s: re-sending %d firing alert(s) failed: %s", sink.name, len(notices), outcome.error
            )

    async def _send(self, r: _Runner, items: Sequence[OutboxItem]) -> Outcome:
        sink = r.sink
        now = self.clock()
        notices = [i.notice for i in items]
        try:
            msg = sink.build(notices, now=now)
        except Exception as e:  # noqa: BLE001 (a notice no builder renders must not block the ones behind it)
            outcome = Outcome("dead", None, f"cannot build the message: {type(e).__name__}: {e}")
            log.error("notify sink %s: %s", sink.name, outcome.error)
            self._settle(r, items, outcome)
            return outcome
        outcome = await self._post(r, msg, now=now)
        self._settle(r, items, outcome)
        if outcome.result == "delivered" and sink.resend_s > 0:
            # What was just sent is fresh; the next re-send of everything firing is a period away.
            r.resend_at = max(r.resend_at, self.clock() + sink.resend_s)
        return outcome

    async def _post(self, r: _Runner, msg: Message, *, now: float) -> Outcome:
        sink = r.sink
        try:
            async with r.client.stream(
                "POST", msg.url, content=msg.body, headers=msg.headers, timeout=sink.timeout_s
            ) as resp:
                body = bytearray()
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) >= MAX_RESPONSE_BYTES:
                        break
                return sink.classify(resp.status_code, bytes(body), resp.headers, now=now)
        except httpx.TimeoutException as e:
            return Outcome("retry", None, f"timeout after {sink.timeout_s:g} s ({type(e).__name__})")
        except httpx.HTTPError as e:
            return Outcome("retry", None, _redact(f"{type(e).__name__}: {e}", msg.url, sink.settings.url))

    def _settle(self, r: _Runner, items: Sequence[OutboxItem], outcome: Outcome) -> None:
        """Record an outcome: outbox first (the truth), then timeline, telemetry and the log."""
        sink = r.sink
        now = self.clock()
        ids = [i.id for i in items]
        digest = len(items) > 1
        err = outcome.as_error()
        if err is None:
            r.failures = 0
            self.outbox.delivered(ids, now=now, detail={"http": outcome.http, "digest": len(items)})
            self.telemetry.notifications.labels(sink.name, "delivered").inc(len(items))
            for i in items:
                self._note(i, "notified", outcome, extra={"digest": len(items)} if digest else None)
            log.debug("notify sink %s: delivered %d notice(s), HTTP %s", sink.name, len(items), outcome.http)
        elif isinstance(err, PermanentError):
            self.telemetry.webhook_failures.labels(sink.name).inc()
            self.outbox.dead(ids, error=str(err), now=now)
            self.telemetry.notifications.labels(sink.name, "dead").inc(len(items))
            for i in items:
                self._note(i, "notify_failed", outcome, extra={"error": outcome.error, "permanent": True})
            log.error("notify sink %s: %d notice(s) refused for good: %s", sink.name, len(items), outcome.error or "-")
            self._page_failure(sink, items, outcome, outcome.error or "refused", reason="refused")
        else:
            self.telemetry.webhook_failures.labels(sink.name).inc()
            r.failures += 1
            if err.delay is not None:
                delay = min(err.delay, self.settings.retry_max_s)
            else:
                delay = backoff_delay(
                    r.failures,
                    initial=self.settings.retry_initial_s,
                    maximum=self.settings.retry_max_s,
                    rng=self.rng,
                )
            next_at = now + delay
            r.paused_until = next_at
            give_up = [i for i in items if next_at - i.created > self.settings.give_up_after_s]
            keep = [i for i in items if i not in give_up]
            if keep:
                self.outbox.retry_later([i.id for i in keep], error=outcome.error or "temporary error", next_at=next_at)
                self.telemetry.notifications.labels(sink.name, "retried").inc(len(keep))
            if give_up:
                why = f"gave up after {self.settings.give_up_after_s:g} s: {outcome.error or 'temporary error'}"
                self.outbox.dead([i.id for i in give_up], error=why, now=now)
                self.telemetry.notifications.labels(sink.name, "dead").inc(len(give_up))
                for i in give_up:
                    self._note(i, "notify_failed", outcome, extra={"error": why, "permanent": False})
                log.error("notify sink %s: gave up on %d notice(s): %s", sink.name, len(give_up), why)
                self._page_failure(sink, give_up, outcome, why, reason="gave_up")
            log.warning(
                "notify sink %s: delivery failed (%s); retrying %d notice(s) in %.1f s",
                sink.name,
                outcome.error,
                len(keep),
                delay,
            )
        self._gauge(sink)

    def _page_failure(
        self, sink: Sink, items: Sequence[OutboxItem], outcome: Outcome, error: str, *, reason: str
    ) -> None:
        """Notices `sink` will never deliver still reach a person: each goes, as a short "sink X failed
        permanently: ..." page (`Notice.sink_failure`), to every other sink whatever statuses it
        takes, once (its own dedup key); the incident's timeline says where (`notify_escalated`).
        A failure page that itself fails is counted and noted, not paged again."""
        others = [s for s in self.sinks if s.name != sink.name]
        why = _redact(error, sink.settings.url)
        now = self.clock()
        for i in items:
            self.telemetry.notify_sink_failed.labels(sink.name, reason).inc()
            if i.notice.failed_sink is not None:
                continue
            notice = i.notice.sink_failure(sink.name, why, at=now)
            try:
                added = self.outbox.enqueue_many([s.name for s in others], notice) if others else []
            except (OutboxError, sqlite3.Error) as e:
                log.error("incident %s: the failure of sink %s cannot be paged: %s", i.incident_id, sink.name, e)
                added = []
            for name in added:
                self.telemetry.notifications.labels(name, "queued").inc()
                self.telemetry.outbox_depth.labels(name).inc()
                runner = self._runners.get(name)
                if runner is not None:
                    runner.wake.set()
            self._note(i, "notify_escalated", outcome, extra={"failed_sink": sink.name, "to": added, "error": why})
            if not others:
                log.error(
                    "incident %s: sink %s failed for good and no other sink is configured: only the API and "
                    "the incident store have it",
                    i.incident_id,
                    sink.name,
                )

    def _note(self, item: OutboxItem, kind: str, outcome: Outcome, *, extra: Mapping[str, Any] | None) -> None:
        if self.store is None:
            return
        detail: dict[str, Any] = {
            "sink": item.sink,
            "status": item.status,
            "http": outcome.http,
            "attempt": item.attempts + 1,
        }
        detail.update({k: v for k, v in (extra or {}).items() if v is not None})
        try:
            self.store.note(item.incident_id, kind, detail)
        except (StoreError, sqlite3.Error) as e:
            log.warning("incident %s: cannot note %s in its timeline: %s", item.incident_id, kind, e)

    def _gauge(self, sink: Sink) -> None:
        try:
            self.telemetry.outbox_depth.labels(sink.name).set(self.outbox.depth(sink.name))
        except OutboxError as e:
            log.warning("outbox: cannot count pending notices: %s", e)


def _earliest(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None


def _redact(text: str, *urls: str) -> str:
    """`text` without the URLs (chat robots carry their token in the URL)."""
    for url in sorted(set(urls), key=len, reverse=True):
        if url:
            text = text.replace(url, "<url>")
    return text


async def _wait_any(wake: asyncio.Event, stop: asyncio.Event, timeout: float | None) -> None:
    if wake.is_set() or stop.is_set():
        return
    waiters = [asyncio.create_task(wake.wait()), asyncio.create_task(stop.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
