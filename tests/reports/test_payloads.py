"""Notices and the payloads built from them: CloudEvents with their signature, Alertmanager alerts,
and the four chat robots, single and digest, in English, Chinese and both.

Signature vectors are computed here independently (hmac/base64 as each vendor documents it) and
also pinned as constants computed with `openssl dgst` outside Python. Golden files pin every
builder's output; regenerate after an intended change with `UPDATE_GOLDEN=1` and review the diff.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import os
import re
import time
import urllib.parse
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paths import GOLDEN as GOLDEN_ROOT

from trainmedic.events import IncidentEvent, JobRef, LogBatch, make_event
from trainmedic.models import I18nText, RootCause
from trainmedic.reports import payloads as P
from trainmedic.reports.notice import Notice, NoticeError, fault_severity, severity_for

GOLDEN = GOLDEN_ROOT / "payloads"
T0 = 1_700_000_000.0
SOURCE = "trainmedic://cluster-a"

# ---------------------------------------------------------------------------------------------------
# fixtures: notices from real IncidentEvents


def root_cause(fault_class: str = "device_error", **kw: Any) -> RootCause:
    base: dict[str, Any] = {
        "fault_class": fault_class,
        "chip": "nvidia",
        "code": "xid:79",
        "vendor_action": "RESTART_BM",
        "action": "reboot_node",
        "node": "gpu-node-1",
        "device": "GPU3",
        "rank": 5,
        "summary": I18nText(
            en="GPU 0000:3b:00 has fallen off the bus (Xid 79)", zh="GPU 0000:3b:00 已从总线掉线（Xid 79）"
        ),
        "hint": I18nText(en="Drain the node and reboot it.", zh="排空该节点并重启。"),
        "rule_id": "nvidia.xid",
        "severity": "critical",
    }
    base.update(kw)
    return RootCause.model_validate(base)


def incident_event(
    status: str = "blocked",
    *,
    incident_id: str = "inc-0001",
    at: float = T0,
    rc: RootCause | None = None,
    job: JobRef | None = None,
    plan: dict[str, Any] | None = None,
    actions: list[dict[str, Any]] | None = None,
    hints: list[I18nText] | None = None,
) -> Any:
    rc = rc if rc is not None else root_cause()
    payload = IncidentEvent(
        incident_id=incident_id,
        status=status,
        job=job or JobRef(namespace="team-a", name="llama-70b", kind="PyTorchJob", api_version="kubeflow.org/v1"),
        node=rc.node,
        root_cause=rc,
        mode="enforce",
        scene_dir=f"/var/lib/trainmedic/scenes/{incident_id}",
        plan=plan,
        actions=actions or [],
        hints=hints or [],
    )
    return make_event(payload, producer="brain/test", at=at)


def notice(status: str = "blocked", **kw: Any) -> Notice:
    report_url = kw.pop("report_url", "https://trainmedic.example/incidents/inc-0001/report")
    return Notice.from_incident_event(incident_event(status, **kw), report_url=report_url)


SINGLE_ACTIONS = [
    {"seq": 0, "name": "notify", "state": "done", "params": {}, "result": {"published": "trainmedic.incidents"}},
    {
        "seq": 1,
        "name": "quarantine_node",
        "state": "done",
        "params": {"node": "gpu-node-1"},
        "result": {"node": "gpu-node-1"},
    },
    {
        "seq": 2,
        "name": "restart_from_checkpoint",
        "state": "failed",
        "params": {},
        "result": {"error": "quota exceeded"},
    },
]
PLAN = {
    "blocked": {"en": "restart budget spent (3 in 1h)", "zh": "重启预算已用完（1 小时内 3 次）"},
    "hints": [{"en": "DeepSpeed: resume with --load_checkpoint", "zh": "DeepSpeed：使用 --load_checkpoint 续训"}],
}


@pytest.fixture
def single() -> list[Notice]:
    return [notice("blocked", plan=PLAN, actions=SINGLE_ACTIONS)]


DIGEST_CASES: list[tuple[str, str, str]] = [
    ("device_error", "xid:79", "blocked"),
    ("device_error", "xid:48", "resolved"),
    ("hang", "nccl_watchdog", "acting"),
    ("hang", "EI0002", "resolved"),
    ("accelerator_oom", "cuda_oom", "resolved"),
    ("accelerator_oom", "EL0004", "observed"),
    ("host_oom", "oom_killed", "resolved"),
    ("comm_init", "EI0006", "failed"),
    ("comm_error", "ncclSystemError", "awaiting_approval"),
    ("device_error", "0x80C98000", "resolved"),
    ("hang", "no_progress", "rejected"),
    ("host_oom", "exit_137", "open"),
]


@pytest.fixture
def digest() -> list[Notice]:
    out = []
    for i, (fc, code, status) in enumerate(DIGEST_CASES):
        rc = root_cause(fc, code=code, node=f"node-{i % 4}", chip="ascend" if code.startswith("E") else "nvidia")
        out.append(
            notice(
                status,
                incident_id=f"inc-{i:04d}",
                at=T0 + i,
                rc=rc,
                report_url=f"https://trainmedic.example/incidents/inc-{i:04d}/report",
            )
        )
    return out


# ---------------------------------------------------------------------------------------------------
# Notice


def test_notice_from_a_real_incident_event() -> None:
    ev = incident_event("blocked", plan=PLAN, actions=SINGLE_ACTIONS, at=T0 + 0.25)
    n = Notice.from_incident_event(ev, report_url="https://x/r")
    assert (n.incident_id, n.status, n.time) == ("inc-0001", "blocked", T0 + 0.25)
    assert (n.fault_class, n.code, n.chip, n.vendor_action, n.action) == (
        "device_error",
        "xid:79",
        "nvidia",
        "RESTART_BM",
        "reboot_node",
    )
    assert (n.node, n.device, n.rank) == ("gpu-node-1", "GPU3", 5)
    assert (n.namespace, n.job, n.job_kind) == ("team-a", "llama-70b", "PyTorchJob")
    assert n.summary == {
        "en": "GPU 0000:3b:00 has fallen off the bus (Xid 79)",
        "zh": "GPU 0000:3b:00 已从总线掉线（Xid 79）",
    }
    assert n.hint == {"en": "Drain the node and reboot it.", "zh": "排空该节点并重启。"}
    assert n.blocked == PLAN["blocked"]
    assert n.advice == tuple(PLAN["hints"])
    assert n.mode == "enforce" and n.scene_dir == "/var/lib/trainmedic/scenes/inc-0001"
    assert [a["name"] for a in n.actions] == ["notify", "quarantine_node", "restart_from_checkpoint"]
    assert n.actions[2] == {"name": "restart_from_checkpoint", "state": "failed", "result": {"error": "quota exceeded"}}
    assert n.severity == "critical" and n.base_severity == "critical"
    assert n.dedup_key == "inc-0001/blocked"
    assert n.firing
    assert n.report_url == "https://x/r"


def test_the_event_survives_the_bus_and_the_notice_the_outbox() -> None:
    """Encoded on the bus, decoded, made a notice, stored as JSON and read back: the same notice."""
    from trainmedic.events import decode

    ev = decode(incident_event("acting", actions=SINGLE_ACTIONS, hints=[I18nText(en="a", zh="甲")]).encode())
    n = Notice.from_incident_event(ev)
    again = Notice.from_dict(json.loads(json.dumps(n.as_dict())))
    assert again == n
    assert again.dedup_key == n.dedup_key
    assert n.advice == ({"en": "a", "zh": "甲"},)


def test_plan_hints_are_used_when_the_event_carries_none() -> None:
    n = notice("acting", plan=PLAN)
    assert n.advice == tuple(PLAN["hints"])


def test_notice_without_root_cause_still_says_something() -> None:
    payload = IncidentEvent(incident_id="inc-x", status="failed", plan={"fault_class": "hang", "code": "no_progress"})
    n = Notice.from_incident_event(make_event(payload, at=T0))
    assert n.fault_class == "hang" and n.code == "no_progress"
    assert n.summary["en"] and n.summary["zh"]
    assert n.severity == "critical"
    assert n.job is None and n.hint is None


def test_a_non_incident_event_is_refused() -> None:
    ev = make_event(LogBatch(namespace="a", pod="p", container="c", lines=["x"]))
    with pytest.raises(NoticeError, match="log_batch"):
        Notice.from_incident_event(ev)


@pytest.mark.parametrize("data", [{}, {"incident_id": "a"}, {"incident_id": "a", "status": "open", "time": "soon"}])
def test_a_malformed_stored_notice_is_refused(data: dict[str, Any]) -> None:
    with pytest.raises(NoticeError):
        Notice.from_dict(data)


@pytest.mark.parametrize(
    ("status", "fault_class", "expected"),
    [
        ("resolved", "device_error", "info"),
        ("rejected", "hang", "info"),
        ("blocked", "accelerator_oom", "critical"),
        ("failed", "host_oom", "critical"),
        ("awaiting_approval", "host_oom", "critical"),
        ("open", "device_error", "critical"),
        ("acting", "hang", "critical"),
        ("observed", "comm_init", "critical"),
        ("open", "comm_error", "critical"),
        ("acting", "accelerator_oom", "warning"),
        ("open", "host_oom", "warning"),
        ("observed", None, "warning"),
        ("some_future_status", "hang", "critical"),
    ],
)
def test_severity_rules(status: str, fault_class: str | None, expected: str) -> None:
    assert severity_for(status, fault_class) == expected


@pytest.mark.parametrize(("rule", "expected"), [("critical", "critical"), ("error", "critical"), ("info", "info")])
def test_unknown_class_falls_back_to_the_rule_severity(rule: str, expected: str) -> None:
    assert fault_severity(None, rule) == expected


@pytest.mark.parametrize("status", ["open", "acting", "blocked", "resolved", "rejected"])
def test_base_severity_is_stable_over_the_incident(status: str) -> None:
    assert notice(status, rc=root_cause("host_oom", code="oom_killed")).base_severity == "warning"


@pytest.mark.parametrize(
    ("status", "firing"), [("resolved", False), ("rejected", False), ("observed", True), ("acting", True)]
)
def test_firing(status: str, firing: bool) -> None:
    assert notice(status).firing is firing


# ---------------------------------------------------------------------------------------------------
# CloudEvents


def parse_rfc3339(s: str) -> datetime:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", s), s
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


def test_cloudevent_structured_json(single: list[Notice]) -> None:
    n = single[0]
    ce = P.cloudevent(n, source=SOURCE)
    # REQUIRED attributes: specversion, id, source, type (non-empty strings).
    for attr in ("specversion", "id", "source", "type"):
        assert isinstance(ce[attr], str) and ce[attr]
    assert ce["specversion"] == "1.0"
    assert ce["id"] == "inc-0001/blocked" == n.dedup_key
    assert ce["type"] == "io.trainmedic.incident.blocked"
    assert ce["subject"] == "inc-0001"
    assert parse_rfc3339(ce["time"]).timestamp() == n.time
    assert ce["datacontenttype"] == "application/json"
    assert ce["data"] == n.as_dict()
    # Attribute names: lower-case letters and digits only (the spec's naming rule).
    assert all(re.fullmatch(r"[a-z0-9]+", k) for k in ce if k != "data")
    assert json.loads(P.encode_body(ce)) == ce


def test_cloudevents_batch(digest: list[Notice]) -> None:
    batch = P.cloudevents_batch(digest, source=SOURCE)
    assert [e["id"] for e in batch] == [n.dedup_key for n in digest]
    assert len({e["id"] for e in batch}) == len(digest)
    assert P.CLOUDEVENTS_BATCH_CONTENT_TYPE.startswith("application/cloudevents-batch+json")
    assert P.CLOUDEVENT_CONTENT_TYPE.startswith("application/cloudevents+json")
    assert P.cloudevents_batch([], source=SOURCE) == []


def test_cloudevent_needs_a_source(single: list[Notice]) -> None:
    with pytest.raises(ValueError, match="source"):
        P.cloudevent(single[0], source="")


def test_encode_body_keeps_chinese_as_utf8_and_survives_lone_surrogates() -> None:
    body = P.encode_body({"zh": "显存不足", "bad": "x\ud800y"})
    assert "显存不足".encode() in body
    assert json.loads(body) == {"zh": "显存不足", "bad": "x?y"}


# ---------------------------------------------------------------------------------------------------
# signatures

SECRET = b"whsec_test"
BODY = b'{"a":1}'
# printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac 'whsec_test'
OPENSSL_VECTOR = "v1=38877139021993b830af32feea6e18a8da83eb2f6e49ee50bd9e4cf4ca4d3789"


def independent_sign(secret: bytes, ts: int, body: bytes) -> str:
    return "v1=" + hmac.new(secret, f"{ts}.".encode() + body, hashlib.sha256).hexdigest()


def test_sign_known_vector() -> None:
    assert P.sign(SECRET, 1_700_000_000, BODY) == OPENSSL_VECTOR


@pytest.mark.parametrize("body", [b"", BODY, "显存不足".encode(), bytes(range(256))])
def test_sign_matches_an_independent_computation(body: bytes) -> None:
    assert P.sign(b"k" * 64, 1_234, body) == independent_sign(b"k" * 64, 1_234, body)


def signed(ts: int = 1_700_000_000, body: bytes = BODY, secret: bytes = SECRET) -> dict[str, str]:
    return P.signature_headers(secret, body, timestamp=ts)


def test_verify_accepts_a_fresh_signature() -> None:
    assert P.verify(SECRET, signed(), BODY, now=1_700_000_010)


@pytest.mark.parametrize(
    ("why", "headers", "body", "secret", "now"),
    [
        ("wrong secret", signed(), BODY, b"other", 1_700_000_000),
        ("tampered body", signed(), b'{"a":2}', SECRET, 1_700_000_000),
        ("stale", signed(), BODY, SECRET, 1_700_000_000 + 301),
        ("from the future", signed(), BODY, SECRET, 1_700_000_000 - 301),
        ("no signature", {P.TIMESTAMP_HEADER: "1700000000"}, BODY, SECRET, 1_700_000_000),
        ("no timestamp", {P.SIGNATURE_HEADER: OPENSSL_VECTOR}, BODY, SECRET, 1_700_000_000),
        ("no headers", {}, BODY, SECRET, 1_700_000_000),
        ("timestamp moved", {**signed(), P.TIMESTAMP_HEADER: "1700000001"}, BODY, SECRET, 1_700_000_000),
        ("timestamp not a number", {**signed(), P.TIMESTAMP_HEADER: "17e8"}, BODY, SECRET, 1_700_000_000),
        ("huge timestamp", {**signed(), P.TIMESTAMP_HEADER: "9" * 5000}, BODY, SECRET, 1_700_000_000),
        ("negative timestamp", {**signed(), P.TIMESTAMP_HEADER: "-1"}, BODY, SECRET, 0),
        ("unicode digits", {**signed(), P.TIMESTAMP_HEADER: "１７００"}, BODY, SECRET, 1_700),
        (
            "other scheme",
            {**signed(), P.SIGNATURE_HEADER: OPENSSL_VECTOR.replace("v1=", "v0=")},
            BODY,
            SECRET,
            1_700_000_000,
        ),
        ("bare hex", {**signed(), P.SIGNATURE_HEADER: OPENSSL_VECTOR[3:]}, BODY, SECRET, 1_700_000_000),
        ("empty signature", {**signed(), P.SIGNATURE_HEADER: ""}, BODY, SECRET, 1_700_000_000),
        ("non-ascii signature", {**signed(), P.SIGNATURE_HEADER: "v1=显存"}, BODY, SECRET, 1_700_000_000),
    ],
)
def test_verify_rejects(why: str, headers: dict[str, str], body: bytes, secret: bytes, now: float) -> None:
    assert not P.verify(secret, headers, body, now=now), why


@pytest.mark.parametrize("delta", [-300, 300])
def test_the_window_edges_are_inside(delta: int) -> None:
    assert P.verify(SECRET, signed(), BODY, now=1_700_000_000 + delta)


def test_a_custom_tolerance() -> None:
    assert not P.verify(SECRET, signed(), BODY, now=1_700_000_061, tolerance_s=60)
    assert P.verify(SECRET, signed(), BODY, now=1_700_000_061, tolerance_s=3600)


def test_headers_are_case_insensitive() -> None:
    headers = {k.lower(): v for k, v in signed().items()}
    assert P.verify(SECRET, headers, BODY, now=1_700_000_000)


def test_rotation_accepts_any_listed_signature() -> None:
    headers = signed()
    old = P.sign(b"old-secret", 1_700_000_000, BODY)
    headers[P.SIGNATURE_HEADER] = f"{old}, {headers[P.SIGNATURE_HEADER]}"
    assert P.verify(SECRET, headers, BODY, now=1_700_000_000)
    assert P.verify(b"old-secret", headers, BODY, now=1_700_000_000)


@pytest.mark.parametrize("call", [lambda: P.sign(b"", 1, b""), lambda: P.verify(b"", {}, b"", now=0)])
def test_an_empty_secret_is_a_configuration_error(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="secret"):
        call()


def docstring_snippet() -> str:
    doc = P.__doc__ or ""
    m = re.search(r"```python\n(.*?)```", doc, re.S)
    assert m, "the module docstring must carry the verification snippet"
    return m.group(1)


def test_the_documented_receiver_snippet_verifies_a_real_delivery(single: list[Notice]) -> None:
    """docs/notifications.md quotes this snippet: it must accept what the sender signs and refuse tampering."""
    scope: dict[str, Any] = {}
    exec(compile(docstring_snippet(), "<receiver snippet>", "exec"), scope)
    receiver_verify = scope["verify"]
    body = P.encode_body(P.cloudevent(single[0], source=SOURCE))
    headers = P.signature_headers(SECRET, body, timestamp=int(time.time()))
    assert receiver_verify(SECRET, headers, body)
    assert not receiver_verify(SECRET, headers, body + b" ")
    assert not receiver_verify(b"wrong", headers, body)
    old = P.signature_headers(SECRET, body, timestamp=int(time.time()) - 3600)
    assert not receiver_verify(SECRET, old, body)


# ---------------------------------------------------------------------------------------------------
# Alertmanager

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
POSTABLE_ALERT_KEYS = {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}


def assert_postable_alerts(alerts: list[dict[str, Any]]) -> None:
    """The postableAlerts shape of Alertmanager's OpenAPI v2 (api/v2/openapi.yaml)."""
    assert isinstance(alerts, list)
    for a in alerts:
        assert set(a) <= POSTABLE_ALERT_KEYS
        assert isinstance(a["labels"], dict) and a["labels"]  # labels: required labelSet
        for k, v in [*a["labels"].items(), *a.get("annotations", {}).items()]:
            assert LABEL_NAME.fullmatch(k), k
            assert isinstance(v, str) and v, (k, v)
        starts = parse_rfc3339(a["startsAt"])
        if "endsAt" in a:
            assert parse_rfc3339(a["endsAt"]) >= starts
        if "generatorURL" in a:
            assert urllib.parse.urlsplit(a["generatorURL"]).scheme in ("http", "https")
    assert json.loads(P.encode_body(alerts)) == alerts


@pytest.mark.parametrize("status", ["open", "acting", "blocked", "failed", "observed", "awaiting_approval"])
def test_alertmanager_firing(status: str) -> None:
    [alert] = P.alertmanager_alerts([notice(status)], now=T0 + 60)
    assert_postable_alerts([alert])
    assert "endsAt" not in alert
    assert alert["labels"] == {
        "alertname": "TrainmedicIncident",
        "incident": "inc-0001",
        "fault_class": "device_error",
        "code": "xid:79",
        "chip": "nvidia",
        "node": "gpu-node-1",
        "namespace": "team-a",
        "job": "llama-70b",
        "severity": "critical",
    }
    assert alert["annotations"]["status"] == status
    assert alert["annotations"]["summary_zh"] == "GPU 0000:3b:00 已从总线掉线（Xid 79）"
    assert alert["generatorURL"] == "https://trainmedic.example/incidents/inc-0001/report"


@pytest.mark.parametrize("status", ["resolved", "rejected"])
def test_alertmanager_resolved_has_ends_at(status: str) -> None:
    [alert] = P.alertmanager_alerts([notice(status, at=T0)], now=T0 + 5)
    assert_postable_alerts([alert])
    assert parse_rfc3339(alert["endsAt"]).timestamp() == T0 + 5


def test_ends_at_is_never_before_starts_at() -> None:
    [alert] = P.alertmanager_alerts([notice("resolved", at=T0)], now=T0 - 30)  # a clock behind
    assert alert["endsAt"] == alert["startsAt"]


def test_labels_do_not_change_between_firing_and_resolved() -> None:
    """Alertmanager identifies an alert by its labels: the resolve must hit the alert that fired."""
    rc = root_cause("host_oom", code="oom_killed")
    firing = P.alertmanager_alerts([notice("blocked", rc=rc)], now=T0)[0]["labels"]
    resolved = P.alertmanager_alerts([notice("resolved", rc=rc)], now=T0)[0]["labels"]
    assert firing == resolved


def test_missing_labels_are_omitted_not_empty() -> None:
    payload = IncidentEvent(incident_id="inc-y", status="open")
    n = Notice.from_incident_event(make_event(payload, at=T0))
    [alert] = P.alertmanager_alerts([n], now=T0, generator_url="https://trainmedic.example/")
    assert_postable_alerts([alert])
    assert alert["labels"] == {"alertname": "TrainmedicIncident", "incident": "inc-y", "severity": "warning"}
    assert alert["generatorURL"] == "https://trainmedic.example/"


def test_one_alert_per_incident_in_its_latest_state(digest: list[Notice]) -> None:
    acting = notice("acting", at=T0)
    resolved = notice("resolved", at=T0 + 10)
    alerts = P.alertmanager_alerts([resolved, *digest, acting], now=T0 + 20)
    assert_postable_alerts(alerts)
    ids = [a["labels"]["incident"] for a in alerts]
    assert ids == ["inc-0001", *[n.incident_id for n in digest if n.incident_id != "inc-0001"]]
    assert alerts[0]["annotations"]["status"] == "resolved" and "endsAt" in alerts[0]


@pytest.mark.asyncio
async def test_a_real_alertmanager_takes_the_alert_and_its_resolve() -> None:
    """Debian's Alertmanager accepts what we build (hostile and huge texts included), holds one
    alert per incident, and the resolve ends exactly the alert that fired."""
    from servers.alertmanager import AlertmanagerServer

    now = time.time()
    firing = [
        notice("blocked", at=now - 60),
        hostile_notice_for("inc-0002", now - 30),
        huge_notice_for("inc-0003", now),
    ]
    async with AlertmanagerServer() as am:
        await am.post_alerts(P.alertmanager_alerts(firing, now=now))
        held = await am.wait_for_alerts(lambda alerts: len(alerts) == 3)
        by_id = {a["labels"]["incident"]: a for a in held}
        assert by_id["inc-0001"]["labels"]["severity"] == "critical"
        assert by_id["inc-0001"]["annotations"]["summary_zh"] == "GPU 0000:3b:00 已从总线掉线（Xid 79）"
        assert all(a["status"]["state"] == "active" for a in held)
        await am.post_alerts(P.alertmanager_alerts([notice("resolved", at=now + 1)], now=now + 1))
        left = await am.wait_for_alerts(lambda alerts: len(alerts) == 2)
        assert {a["labels"]["incident"] for a in left} == {"inc-0002", "inc-0003"}


# ---------------------------------------------------------------------------------------------------
# chat robots

Builder = Callable[[list[Notice], str], dict[str, Any]]
BUILDERS: dict[str, Builder] = {
    "feishu": lambda ns, lang: P.feishu_message(ns, lang=lang, secret="feishu-secret", timestamp=1_700_000_000),
    "dingtalk": lambda ns, lang: P.dingtalk_message(ns, lang=lang),
    "wecom": lambda ns, lang: P.wecom_message(ns, lang=lang),
    "slack": lambda ns, lang: P.slack_message(ns, lang=lang),
}


def all_text(msg: Any) -> str:
    """Every string in a message, joined (what a reader could see)."""
    if isinstance(msg, str):
        return msg
    if isinstance(msg, dict):
        return "\n".join(all_text(v) for v in msg.values())
    if isinstance(msg, list):
        return "\n".join(all_text(v) for v in msg)
    return ""


def assert_shape(kind: str, msg: dict[str, Any]) -> None:
    if kind == "feishu":
        assert msg["msg_type"] == "interactive"
        card = msg["card"]
        assert card["header"]["title"]["tag"] == "plain_text"
        assert card["header"]["template"] in {"red", "orange", "green", "blue"}
        assert all(e["tag"] in {"div", "hr", "note"} for e in card["elements"])
        assert sum(_utf8(e["text"]["content"]) for e in card["elements"] if e["tag"] == "div") <= P.FEISHU_MAX_BYTES
    elif kind == "dingtalk":
        assert msg["msgtype"] == "markdown"
        assert set(msg["markdown"]) == {"title", "text"}
        assert _utf8(msg["markdown"]["text"]) <= P.DINGTALK_MAX_BYTES
    elif kind == "wecom":
        assert msg["msgtype"] == "markdown"
        assert set(msg["markdown"]) == {"content"}
        assert _utf8(msg["markdown"]["content"]) <= P.WECOM_MAX_BYTES
    else:
        assert isinstance(msg["text"], str) and msg["text"]
        blocks = msg["blocks"]
        assert blocks[0]["type"] == "header" and len(blocks[0]["text"]["text"]) <= P.SLACK_HEADER_MAX_CHARS
        for b in blocks:
            if b["type"] == "section":
                assert b["text"]["type"] == "mrkdwn" and len(b["text"]["text"]) <= P.SLACK_SECTION_MAX_CHARS
        assert len(blocks) <= 50
        # Slack counts characters; messages near 13,000 characters of blocks are refused in practice.
        assert len(all_text(blocks)) < 12_000
    # Bodies are sent as JSON: valid; the Chinese robots' under 20 KB even with every non-ASCII
    # character escaped (\uXXXX).
    assert json.loads(json.dumps(msg)) == msg
    if kind != "slack":
        assert len(json.dumps(msg).encode()) < 20_000
    assert "trainmedic" in all_text(msg)


def _utf8(s: str) -> int:
    return len(s.encode("utf-8"))


LANG_WORDS = {"en": "Summary", "zh": "摘要"}


@pytest.mark.parametrize("lang", P.LANGS)
@pytest.mark.parametrize("kind", list(BUILDERS))
def test_single_message(kind: str, lang: str, single: list[Notice]) -> None:
    msg = BUILDERS[kind](single, lang)
    assert_shape(kind, msg)
    text = all_text(msg)
    assert "inc-0001" in text and "gpu-node-1" in text and "xid:79" in text
    for lg, word in LANG_WORDS.items():
        assert (word in text) is (lang in (lg, "both")), (lg, word)
    if lang != "en":
        assert "已从总线掉线" in text and "重启预算已用完" in text
    if lang != "zh":
        assert "fallen off the bus" in text and "restart budget spent" in text


@pytest.mark.parametrize("lang", P.LANGS)
@pytest.mark.parametrize("kind", list(BUILDERS))
def test_digest_message(kind: str, lang: str, digest: list[Notice]) -> None:
    msg = BUILDERS[kind](digest, lang)
    assert_shape(kind, msg)
    text = all_text(msg)
    # At most DIGEST_ITEMS listed (fewer where the robot's size limit says so), then the rest counted.
    more = len(digest) - P.DIGEST_ITEMS
    if lang != "zh":
        assert "12 incidents" in text
        m = re.search(r"^… and (\d+) more$", text, re.M)
        assert m and int(m.group(1)) >= more
        assert f"{len(digest) - int(m.group(1))}. [" in text
        assert "Resolved 5" in text
    if lang != "en":
        assert "12 个事件" in text
        m = re.search(r"^……另有 (\d+) 条$", text, re.M)
        assert m and int(m.group(1)) >= more
        assert "已恢复 5" in text
    # Counts by fault class, and the list starts with the critical ones.
    assert "device_error 3" in text and "hang 3" in text
    first_item = re.search(r"^1\. \[([^\]]+)\]", text, re.M)
    assert first_item and first_item.group(1) in ("CRITICAL", "严重")


def test_digest_collapses_updates_of_one_incident() -> None:
    updates = [notice("open", at=T0), notice("acting", at=T0 + 1), notice("resolved", at=T0 + 2)]
    title, body = P.notice_text(updates, lang="en")
    assert title.startswith("[INFO] Resolved")
    assert "Remediating" not in body


@pytest.mark.parametrize(("status", "template"), [("blocked", "red"), ("resolved", "green"), ("open", "orange")])
def test_feishu_header_colour(status: str, template: str) -> None:
    rc = root_cause("host_oom", code="oom_killed") if status == "open" else None
    msg = P.feishu_message([notice(status, rc=rc)], lang="en", secret=None, timestamp=0)
    assert msg["card"]["header"]["template"] == template
    assert "sign" not in msg and "timestamp" not in msg


# -- signing of the robots

FEISHU_TS = 1_599_360_473
FEISHU_SECRET = "test-secret"
# K=$(printf '1599360473\ntest-secret' | xxd -p | tr -d '\n')
# printf '' | openssl dgst -sha256 -mac HMAC -macopt hexkey:$K -binary | base64
FEISHU_VECTOR = "wSds2BzzFIIGf/WrhUO+NI1q/9j+FRJd3JNHKAq0NZY="


def test_feishu_sign_known_vector() -> None:
    assert P.feishu_sign(FEISHU_SECRET, FEISHU_TS) == FEISHU_VECTOR


def test_feishu_sign_as_the_doc_describes(single: list[Notice]) -> None:
    """string_to_sign = timestamp + "\\n" + secret, used as the HmacSHA256 key over empty data, base64."""
    msg = P.feishu_message(single, lang="zh", secret="SEC-abc", timestamp=1_700_000_123)
    key = b"1700000123\nSEC-abc"
    expected = base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()
    assert msg["timestamp"] == "1700000123"
    assert msg["sign"] == expected


DING_TS = 1_577_262_236_760
DING_SECRET = "SEC000example"
# printf '1577262236760\nSEC000example' | openssl dgst -sha256 -hmac 'SEC000example' -binary | base64
DING_VECTOR = "XE9OAabzpAgJsx6spsauyydA0p/ioJ2bs+HcbL8Z/6w="


def test_dingtalk_sign_known_vector() -> None:
    assert P.dingtalk_sign(DING_SECRET, DING_TS) == DING_VECTOR
    url = P.dingtalk_signed_url("https://oapi.dingtalk.com/robot/send?access_token=T", DING_SECRET, DING_TS)
    assert url == (
        "https://oapi.dingtalk.com/robot/send?access_token=T"
        f"&timestamp={DING_TS}&sign=XE9OAabzpAgJsx6spsauyydA0p%2FioJ2bs%2BHcbL8Z%2F6w%3D"
    )


@pytest.mark.parametrize(
    ("url", "sep"),
    [
        ("https://oapi.dingtalk.com/robot/send?access_token=abc", "&"),
        ("http://127.0.0.1:9/robot", "?"),
        ("http://127.0.0.1:9/robot?", ""),
    ],
)
def test_dingtalk_signed_url_as_the_doc_describes(url: str, sep: str) -> None:
    """HmacSHA256 keyed by the secret over timestamp + "\\n" + secret, base64, then urlEncode."""
    secret, ts = "SECxyz+/=", 1_700_000_000_123
    signed_url = P.dingtalk_signed_url(url, secret, ts)
    assert signed_url.startswith(url + sep + f"timestamp={ts}&sign=")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(signed_url).query)
    expected = base64.b64encode(hmac.new(secret.encode(), f"{ts}\n{secret}".encode(), hashlib.sha256).digest())
    assert query["sign"] == [expected.decode()]
    assert query["timestamp"] == [str(ts)]


def test_dingtalk_needs_a_secret() -> None:
    with pytest.raises(ValueError, match="secret"):
        P.dingtalk_signed_url("http://x/", "", 1)


# -- bad input: languages, nothing to send, escaping, sizes


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_unknown_language_is_refused(kind: str, single: list[Notice]) -> None:
    with pytest.raises(ValueError, match="language"):
        BUILDERS[kind](single, "fr")


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_no_notices_is_refused(kind: str) -> None:
    with pytest.raises(ValueError, match="no notices"):
        BUILDERS[kind]([], "en")


HOSTILE = 'x <!channel> <@all> <at id=all></at> <script>alert(1)</script> & "quoted" \\ back\nslash \x00\x1b[31m'


def hostile_notice_for(incident_id: str, at: float) -> Notice:
    rc = root_cause(summary=I18nText(en=HOSTILE, zh=HOSTILE), hint=I18nText(en=HOSTILE, zh=HOSTILE))
    return notice("blocked", rc=rc, incident_id=incident_id, at=at)


def hostile_notice() -> Notice:
    return hostile_notice_for("inc-0001", T0)


def test_slack_escapes_control_sequences() -> None:
    msg = P.slack_message([hostile_notice()], lang="en")
    section = msg["blocks"][1]["text"]["text"]
    assert "&lt;!channel&gt;" in section and "&lt;@all&gt;" in section and "&amp;" in section
    assert "<!channel>" not in all_text(msg) and "<script>" not in all_text(msg)
    assert "\x00" not in all_text(msg) and "\x1b" not in all_text(msg)


@pytest.mark.parametrize("kind", ["feishu", "dingtalk", "wecom"])
def test_markdown_robots_cannot_be_made_to_mention_anyone(kind: str) -> None:
    msg = BUILDERS[kind]([hostile_notice()], "both")
    text = all_text(msg)
    for markup in ("<@all>", "<at id=all>", "<!channel>", "<script>"):
        assert markup not in text
    assert "<\u200b@all>" in text  # still readable
    assert '"quoted"' in text  # and the JSON still holds
    assert_shape(kind, msg)


HUGE_ZH = "显存不足，" * 6000  # 30000 characters, 90000 bytes


def huge_notice_for(incident_id: str, at: float) -> Notice:
    return Notice.from_dict({**huge_notice().as_dict(), "incident_id": incident_id, "time": at})


def huge_notice(i: int = 0) -> Notice:
    rc = root_cause(
        summary=I18nText(en=HUGE_ZH, zh=HUGE_ZH),
        hint=I18nText(en=HUGE_ZH, zh=HUGE_ZH),
        code="错" * 500,
        node="节点" * 500,
        vendor_action="V" * 2000,
    )
    actions = [{"name": "重启" * 100, "state": "failed", "result": {"error": HUGE_ZH}} for _ in range(40)]
    plan = {"blocked": {"en": HUGE_ZH, "zh": HUGE_ZH}, "hints": [{"en": HUGE_ZH, "zh": HUGE_ZH}] * 6}
    return notice(
        "failed",
        rc=rc,
        incident_id=f"inc-{i:04d}",
        actions=actions,
        plan=plan,
        job=JobRef(namespace="命名空间" * 50, name="作业" * 500),
        report_url="https://trainmedic.example/" + "x" * 5000,
    )


@functools.cache
def huge_notices(count: int) -> list[Notice]:
    first = huge_notice(0)
    return [first, *(Notice.from_dict({**first.as_dict(), "incident_id": f"inc-{i:04d}"}) for i in range(1, count))]


@pytest.mark.parametrize("count", [1, 3, 600])
@pytest.mark.parametrize("lang", P.LANGS)
@pytest.mark.parametrize("kind", list(BUILDERS))
def test_size_limits_with_huge_chinese_text(kind: str, lang: str, count: int) -> None:
    ns = huge_notices(count)
    msg = BUILDERS[kind](ns, lang)
    assert_shape(kind, msg)
    text = all_text(msg)
    assert text.encode("utf-8").decode("utf-8") == text  # no half characters
    assert "已截断" in text or "truncated" in text or count > 1
    # The reference to the incident survives the cutting.
    assert "inc-0000" in text


@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("lang", P.LANGS)
def test_notice_text_respects_max_bytes(lang: str, count: int) -> None:
    title, body = P.notice_text(huge_notices(count), lang=lang, max_bytes=2000)
    assert len(body.encode()) <= 2000
    assert title


@pytest.mark.parametrize("kind", list(BUILDERS))
@settings(max_examples=25, deadline=None)
@given(
    text=st.text(min_size=1, max_size=3000),
    node=st.text(max_size=200),
    lang=st.sampled_from(P.LANGS),
    count=st.integers(min_value=1, max_value=3),
)
def test_any_text_gives_valid_bounded_messages(kind: str, text: str, node: str, lang: str, count: int) -> None:
    summary = text if text.strip() else "x"
    rc = root_cause(summary=I18nText(en=summary, zh=summary), node=node or None)
    ns = [Notice.from_incident_event(incident_event("blocked", rc=rc, incident_id=f"i{i}")) for i in range(count)]
    msg = BUILDERS[kind](ns, lang)
    assert_shape(kind, msg)
    assert json.loads(P.encode_body(msg)) is not None


# ---------------------------------------------------------------------------------------------------
# golden files


def golden_payloads(single: list[Notice], digest: list[Notice]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "cloudevent.single": P.cloudevent(single[0], source=SOURCE),
        "cloudevents.digest": P.cloudevents_batch(digest, source=SOURCE),
        "alertmanager.single": P.alertmanager_alerts(single, now=T0 + 60),
        "alertmanager.digest": P.alertmanager_alerts(digest, now=T0 + 60, generator_url="https://trainmedic.example/"),
    }
    for case, ns in (("single", single), ("digest", digest)):
        for lang in P.LANGS:
            out[f"notice_text.{case}.{lang}"] = list(P.notice_text(ns, lang=lang))
            for kind, build in BUILDERS.items():
                out[f"{kind}.{case}.{lang}"] = build(ns, lang)
    return out


GOLDEN_NAMES = [
    *(f"{k}" for k in ("cloudevent.single", "cloudevents.digest", "alertmanager.single", "alertmanager.digest")),
    *(
        f"{kind}.{case}.{lang}"
        for kind in ["notice_text", *BUILDERS]
        for case in ("single", "digest")
        for lang in P.LANGS
    ),
]


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_payload_matches_golden(name: str, single: list[Notice], digest: list[Notice]) -> None:
    out = json.dumps(golden_payloads(single, digest)[name], ensure_ascii=False, indent=2, sort_keys=True) + "\n"
    golden = GOLDEN / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(out, encoding="utf-8")
    assert golden.exists(), f"missing {golden}: run with UPDATE_GOLDEN=1"
    assert out == golden.read_text(encoding="utf-8")


def test_every_golden_file_is_checked(single: list[Notice], digest: list[Notice]) -> None:
    assert sorted(GOLDEN_NAMES) == sorted(golden_payloads(single, digest))
    if GOLDEN.exists():
        assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(GOLDEN_NAMES)
