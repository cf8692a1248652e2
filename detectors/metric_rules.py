"""Metric rules: a device counter or state that turns bad becomes a finding, once.

The watchers publish accelerator metrics in the unified vocabulary of udal (`MetricBatch`, see
udal/base.py for what each name means). Logs say *that* a job failed; these samples often say *which
device* did it, sometimes before the job notices. The rules are stateful edge detectors, one state
per (job, node, device, vendor metric), with the time passed in (pure: no clock, no I/O):

| rule id                  | metric            | fires when                                  | class        |
|--------------------------|-------------------|---------------------------------------------|--------------|
| metric.xid               | xid_errors        | the value becomes a new non-zero Xid        | catalog's    |
| metric.ecc_dbe           | ecc_dbe           | the uncorrectable ECC counter rises         | device_error |
| metric.row_remap_failure | row_remap_failure | the failure flag / count becomes non-zero   | device_error |
| metric.health            | health            | the device goes from healthy (1) to 0       | device_error |
| metric.link_down         | link_status       | a link goes from up (1) to down (0)         | comm_error   |
| metric.network_down      | network_status    | the port goes from reachable (1) to 0       | comm_error   |

Semantics, and why:

* Baseline: the first sample of a (job, node, device, metric) only records the value. A counter that
  was already high, or an Xid that DCGM still holds from last week, when the agent (or a job) starts is
  not a new fault of this job. The price: a device already unhealthy at start is not reported here
  (the node and device-plugin signals report it).
* `xid_errors` is the value of the LAST Xid (DCGM_FI_DEV_XID_ERRORS is a gauge, not a count), so the
  rule fires when the value changes to a non-zero value; the same Xid twice in a row is invisible in
  that gauge. The code is `xid:<n>`; class, vendor bucket and action come from the chip's catalog.
* Counters (`ecc_dbe`) fire when they rise; while they keep rising at each sample the condition
  persists and does not fire again; a flat sample clears it, so a later rise fires again. A counter
  that drops was reset (driver reload, device reset): it is re-baselined without firing.
* States (`health`, `link_status`, `network_status`) fire on the transition to 0, not again while
  they stay 0, and again after they came back to 1 and drop once more. A negative value means the
  exporter could not read the state (npu-exporter reports -1 when the DCMI call fails): it is
  ignored and changes nothing. NaN and infinities are ignored everywhere.
* A per-link sample names its device `<device>/link<N>`; the finding is localised to `<device>`
  with the link in `groups["link"]`.
* Each job has its own state: a node-level signal is published once per job on the node, and each
  job's copy must be able to produce that job's finding. The node's own state (the copies keyed by
  the node, when no job runs there) follows the jobs' copies silently, so a value a job already
  reported (DCGM's Xid gauge still holding 79 after the job was moved off the quarantined node) is
  not reported again for the node; a change while no job was there is. Each vendor metric has its own state too:
  dcgm-exporter (via Prometheus) and NVML may report the same GPU, and DCGM's Xid gauge may still
  hold an Xid from before NVML's first event; mixing them would fire at every alternation.

Also here, for the hang detector: the recent `accelerator_utilization` of each device and
`flat_utilization`, which tells whether a series stayed at one level (both a device idling at 0% and
a collective spinning at 100% are "flat"; a training step is not).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from trainmedic import udal
from trainmedic.models import Action, FaultClass, Finding, I18nText, Severity, Source

UTILIZATION = "accelerator_utilization"


class MetricSampleLike(Protocol):
    """What a rule reads from a sample (trainmedic.events.MetricSample has these fields)."""

    @property
    def name(self) -> str: ...

    @property
    def value(self) -> float: ...

    @property
    def device(self) -> str | None: ...

    @property
    def vendor_name(self) -> str | None: ...


class Kind(Enum):
    NEW_VALUE = "new_value"  # fires when the value becomes a new non-zero value
    RISING = "rising"  # fires when a counter rises after a flat sample (or the baseline)
    DOWN = "down"  # fires when a 1/0 state goes to 0
    RAISED = "raised"  # fires when a flag or count leaves 0


@dataclass(frozen=True, slots=True)
class MetricRule:
    rule_id: str
    metric: str
    kind: Kind
    fault_class: FaultClass
    code: str
    severity: Severity
    action: Action
    message: I18nText


RULES: tuple[MetricRule, ...] = (
    MetricRule(
        rule_id="metric.xid",
        metric="xid_errors",
        kind=Kind.NEW_VALUE,
        fault_class=FaultClass.DEVICE_ERROR,
        code="xid:{value}",
        severity=Severity.ERROR,
        action=Action.RESET_DEVICE,
        message=I18nText(
            en="Device {device} on node {node} reported Xid {value}.",
            zh="节点 {node} 的设备 {device} 报告 Xid {value}。",
        ),
    ),
    MetricRule(
        rule_id="metric.ecc_dbe",
        metric="ecc_dbe",
        kind=Kind.RISING,
        fault_class=FaultClass.DEVICE_ERROR,
        code="ecc_dbe",
        severity=Severity.CRITICAL,
        action=Action.RESET_DEVICE,
        message=I18nText(
            en="Uncorrectable (double-bit) ECC errors on device {device} of node {node} rose from {previous} to "
            "{value}: device memory returned corrupted data. Stop the job on this device and reset it before reuse.",
            zh="节点 {node} 的设备 {device} 不可纠正（双比特）ECC 错误数从 {previous} 增至 {value}："
            "设备内存数据已损坏。请停止该设备上的作业，复位设备后再使用。",
        ),
    ),
    MetricRule(
        rule_id="metric.row_remap_failure",
        metric="row_remap_failure",
        kind=Kind.RAISED,
        fault_class=FaultClass.DEVICE_ERROR,
        code="row_remap_failure",
        severity=Severity.CRITICAL,
        action=Action.RESET_DEVICE,
        message=I18nText(
            en="Memory row remapping failed on device {device} of node {node}: the device can no longer repair "
            "its memory. Reset it; if it recurs, contact hardware support.",
            zh="节点 {node} 的设备 {device} 内存行重映射失败：设备已无法自行修复内存。"
            "请复位设备；如再次出现请联系硬件支持。",
        ),
    ),
    MetricRule(
        rule_id="metric.health",
        metric="health",
        kind=Kind.DOWN,
        fault_class=FaultClass.DEVICE_ERROR,
        code="health",
        severity=Severity.CRITICAL,
        action=Action.RESET_DEVICE,
        message=I18nText(
            en="Device {device} on node {node} turned unhealthy{error_code_en}. Move the job off this device.",
            zh="节点 {node} 的设备 {device} 变为不健康{error_code_zh}。请将作业迁离该设备。",
        ),
    ),
    MetricRule(
        rule_id="metric.link_down",
        metric="link_status",
        kind=Kind.DOWN,
        fault_class=FaultClass.COMM_ERROR,
        code="link_down",
        severity=Severity.ERROR,
        action=Action.RESET_DEVICE,
        message=I18nText(
            en="Link {link} of device {device} on node {node} went down; collective communication through it fails.",
            zh="节点 {node} 的设备 {device} 的链路 {link} 断开，经由该链路的集合通信将失败。",
        ),
    ),
    MetricRule(
        rule_id="metric.network_down",
        metric="network_status",
        kind=Kind.DOWN,
        fault_class=FaultClass.COMM_ERROR,
        code="network_down",
        severity=Severity.ERROR,
        action=Action.RESTART_APP,
        message=I18nText(
            en="The network port of device {device} on node {node} lost connectivity (network status 0).",
            zh="节点 {node} 的设备 {device} 的网口失去连通性（网络状态为 0）。",
        ),
    ),
)

RULES_BY_METRIC: Mapping[str, MetricRule] = {r.metric: r for r in RULES}


@dataclass(slots=True)
class _Track:
    last: float
    active: bool
    t: float


def _bad_at_baseline(kind: Kind, value: float) -> bool:
    if kind is Kind.DOWN:
        return value < 0.5
    if kind is Kind.RISING:
        return False
    return value != 0


def _usable(kind: Kind, value: float) -> bool:
    if not math.isfinite(value):
        return False
    # A negative state or Xid is "could not read" (npu-exporter -1), never a transition.
    return not (value < 0 and kind in (Kind.DOWN, Kind.NEW_VALUE, Kind.RAISED))


def _step(kind: Kind, track: _Track, value: float) -> bool:
    """Advance one track by one sample; True when the rule fires."""
    fire = False
    if kind is Kind.NEW_VALUE:
        if value != track.last:
            fire = value != 0
            track.active = value != 0
    elif kind is Kind.RISING:
        if value > track.last:
            fire = not track.active
            track.active = True
        else:
            # Flat clears the condition; a drop is a counter reset: re-baseline, do not fire.
            track.active = False
    else:
        bad = value < 0.5 if kind is Kind.DOWN else value > 0
        fire = bad and not track.active
        track.active = bad
    track.last = value
    return fire


def _fmt(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:g}"


def flat_utilization(
    points: Sequence[tuple[float, float]], *, tolerance: float = 2.0, min_samples: int = 3
) -> float | None:
    """The level a utilization series stayed at, or None when it moved (or has too few points).

    Flat means every value lies within `tolerance` percentage points of the others. An idle device
    (stuck at 0) and a collective spinning on the device (stuck near 100, as a hung NCCL all-reduce
    does) are both flat; training steps make the series move. Non-finite and negative values
    ("could not read") are skipped.
    """
    values = [v for _, v in points if math.isfinite(v) and v >= 0]
    if len(values) < max(1, min_samples):
        return None
    if max(values) - min(values) > tolerance:
        return None
    return sum(values) / len(values)


class MetricRules:
    """The metric rules with their per-(job, node, device, vendor metric) state.

    `history_s` bounds the utilization history kept per device; state that saw no sample for
    `stale_after_s` is dropped (a device that comes back is baselined anew).
    """

    def __init__(
        self,
        rules: Sequence[MetricRule] = RULES,
        *,
        history_s: float = 900.0,
        stale_after_s: float = 3600.0,
        max_history: int = 1024,
    ) -> None:
        self.rules: dict[str, MetricRule] = {r.metric: r for r in rules}
        self.history_s = history_s
        self.stale_after_s = stale_after_s
        self.max_history = max_history
        self._tracks: dict[tuple[str | None, str, str | None, str, str | None], _Track] = {}
        self._util: dict[tuple[str, str | None], deque[tuple[float, float]]] = {}
        self._last_prune: float | None = None

    def observe(
        self,
        *,
        node: str,
        chip: str,
        job_key: str | None,
        samples: Sequence[MetricSampleLike],
        t: float,
    ) -> list[Finding]:
        """Feed one batch (one node, one instant); return the findings it causes (often none)."""
        self._prune(t)
        findings: list[Finding] = []
        error_codes = {s.device: s.value for s in samples if s.name == "error_code" and math.isfinite(s.value)}
        for s in samples:
            if s.name == UTILIZATION:
                self._remember_utilization(node, s.device, s.value, t)
                continue
            rule = self.rules.get(s.name)
            if rule is None or not _usable(rule.kind, s.value):
                continue
            # The vendor name is part of the key: DCGM and NVML may report one GPU side by side, and
            # DCGM's Xid gauge can still hold an old Xid that NVML never saw; each keeps its own state.
            key = (job_key, node, s.device, s.name, s.vendor_name)
            if job_key is not None:
                self._follow_node(node, s, rule.kind, t)
            track = self._tracks.get(key)
            if track is None:
                self._tracks[key] = _Track(last=s.value, active=_bad_at_baseline(rule.kind, s.value), t=t)
                continue
            if t < track.t:
                continue  # older than what this state has seen: out-of-order delivery, not news
            previous = track.last
            track.t = t
            if _step(rule.kind, track, s.value):
                findings.append(self._finding(rule, node, chip, job_key, s, previous, t, error_codes))
        return findings

    def _follow_node(self, node: str, s: MetricSampleLike, kind: Kind, t: float) -> None:
        """A job's copy of a sample moves the node's own state too, without a finding: the job's
        state reports the change, and once the jobs have left (a Xid gauge still saying 79 on the
        quarantined node) the node's copy is no news; only a change no job was there to see is."""
        key = (None, node, s.device, s.name, s.vendor_name)
        track = self._tracks.get(key)
        if track is None:
            self._tracks[key] = _Track(last=s.value, active=_bad_at_baseline(kind, s.value), t=t)
        elif t >= track.t:
            track.t = t
            _step(kind, track, s.value)

    # -- findings -------------------------------------------------------------------------------

    def _finding(
        self,
        rule: MetricRule,
        node: str,
        chip: str,
        job_key: str | None,
        sample: MetricSampleLike,
        previous: float,
        t: float,
        error_codes: Mapping[str | None, float],
    ) -> Finding:
        plugin = udal.get_plugin(chip)
        value = _fmt(sample.value)
        device, _, sub = (sample.device or "").partition("/")
        link = sub.removeprefix("link") if sub.startswith("link") else ""
        groups = {"metric": rule.metric, "value": value, "previous": _fmt(previous)}
        if sample.vendor_name:
            groups["vendor_metric"] = sample.vendor_name
        if link:
            groups["link"] = link
        code = rule.code.format(value=value)
        candidates: list[str] = []
        if rule.kind is Kind.NEW_VALUE:
            candidates.append(code)
        # The chip's catalog rows for this metric turning bad (ChipPlugin.metric_codes).
        candidates.extend(plugin.metric_codes.get(rule.metric, ()))
        error_code = error_codes.get(sample.device) if rule.metric == "health" else None
        if error_code is not None and error_code > 0:
            hex_code = f"0x{int(error_code):08X}"
            groups["error_code"] = hex_code
            candidates.insert(0, hex_code)
        entry = next((e for c in candidates if (e := plugin.lookup(c)) is not None), None)
        if entry is not None:
            groups["catalog_code"] = entry.code
        fields = {
            "device": device or "?",
            "node": node,
            "value": value,
            "previous": groups["previous"],
            "link": link or "?",
            "error_code_en": f" (fault code {groups['error_code']})" if "error_code" in groups else "",
            "error_code_zh": f"（故障码 {groups['error_code']}）" if "error_code" in groups else "",
        }
        message = I18nText(en=rule.message.en.format(**fields), zh=rule.message.zh.format(**fields))
        if rule.kind is Kind.NEW_VALUE and entry is not None and entry.code == code:
            # The catalog's own words for this very code are better than the generic sentence.
            message = entry.message
        fault_class = rule.fault_class
        if rule.kind is Kind.NEW_VALUE and entry is not None and entry.fault_class is not None:
            fault_class = entry.fault_class
        where = f"device {sample.device}" if sample.device else "node-level"
        text = f"{sample.vendor_name or rule.metric}={value} (was {groups['previous']}) on {node} {where}"
        return Finding(
            rule_id=rule.rule_id,
            fault_class=fault_class,
            chip=plugin.chip,
            code=code,
            source=Source.METRIC,
            severity=entry.severity if entry is not None else rule.severity,
            text=text,
            file=f"metrics:{node}",
            node=node,
            device=device or None,
            job=job_key,
            timestamp=t,
            vendor_action=entry.vendor_action if entry is not None else None,
            action=entry.action if entry is not None else rule.action,
            message=message,
            groups=groups,
        )

    # -- utilization history (for the hang detector) ---------------------------------------------

    def _remember_utilization(self, node: str, device: str | None, value: float, t: float) -> None:
        if not math.isfinite(value):
            return
        points = self._util.get((node, device))
        if points is None:
            points = self._util[(node, device)] = deque(maxlen=self.max_history)
        if points and t <= points[-1][0]:
            if t == points[-1][0]:
                return  # the same instant again (the copy of another job)
            points.clear()  # time went backwards: the history no longer describes a window
        points.append((t, value))
        while points and points[0][0] < t - self.history_s:
            points.popleft()

    def utilization(self, node: str, *, since: float | None = None) -> dict[str | None, list[tuple[float, float]]]:
        """The remembered utilization of each device of `node` (oldest first), from `since` on."""
        out: dict[str | None, list[tuple[float, float]]] = {}
        for (n, device), points in self._util.items():
            if n != node:
                continue
            kept = [p for p in points if since is None or p[0] >= since]
            if kept:
                out[device] = kept
        return out

    def flat_devices(
        self, node: str, *, since: float, tolerance: float = 2.0, min_samples: int = 3
    ) -> dict[str | None, float]:
        """Devices of `node` whose utilization stayed flat since `since`, with the level it stayed at."""
        out: dict[str | None, float] = {}
        for device, points in self.utilization(node, since=since).items():
            level = flat_utilization(points, tolerance=tolerance, min_samples=min_samples)
            if level is not None:
                out[device] = level
        return out

    # -- housekeeping ----------------------------------------------------------------------------

    def size(self) -> int:
        """Tracks and utilisation series held (the state gauge)."""
        return len(self._tracks) + len(self._util)

    def forget(self, *, node: str | None = None, job_key: str | None = None) -> None:
        """Drop the state of a node (deleted) or of a job (finished)."""
        self._tracks = {
            k: v
            for k, v in self._tracks.items()
            if not ((node is not None and k[1] == node) or (job_key is not None and k[0] == job_key))
        }
        if node is not None:
            self._util = {k: v for k, v in self._util.items() if k[0] != node}

    def forget_jobs(self, job_keys: set[str]) -> None:
        """Drop the state of these jobs (one pass, however many)."""
        if job_keys and any(k[0] in job_keys for k in self._tracks):
            self._tracks = {k: v for k, v in self._tracks.items() if k[0] not in job_keys}

    def _prune(self, t: float) -> None:
        if self._last_prune is not None and t - self._last_prune < min(300.0, self.stale_after_s):
            return
        self._last_prune = t
        limit = t - self.stale_after_s
        self._tracks = {k: v for k, v in self._tracks.items() if v.t >= limit}
        self._util = {k: v for k, v in self._util.items() if v and v[-1][0] >= t - self.history_s}
