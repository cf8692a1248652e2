"""Node quarantine and release, and node problems reported as node-problem-detector reports them:
`NodeQuarantineMixin`, the node half of KubeOps (client.py), and the helpers on node conditions.

Node quarantine and release are read-modify-write: a merge patch replaces lists whole, so the
taints and the node conditions are read, ours changed in place (everyone else's kept) and the
whole list written back together with the resourceVersion that was read; a 409 Conflict re-reads
and re-applies. Both are idempotent: a second quarantine for the same incident writes nothing,
and what was there before (a cordon a person set) is recorded once and restored on release.

A node-level fault (report_node_problem) sets the condition of its kind (problem_condition) and
writes a Warning Event on the Node (node_event); the release clears both.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from trainmedic.models import FaultClass, I18nText
from trainmedic.remediations.kube.errors import ConflictError, KubeError, PermanentKubeError, ReleaseRefused
from trainmedic.remediations.kube.resources import (
    _LABEL_VALUE,
    ACCELERATOR_FAULTS,
    ANN_INCIDENT,
    ANN_QUARANTINE_REASON,
    ANN_QUARANTINED_AT,
    ANN_WAS_UNSCHEDULABLE,
    CONDITION_TYPE,
    EVENT_COMPONENT,
    EVENTS,
    JSON,
    LABEL_QUARANTINED,
    MERGE_PATCH,
    NODE_EVENT_NAMESPACE,
    NODES,
    PROBLEM_ACCELERATOR,
    PROBLEM_CONDITIONS,
    PROBLEM_NODE,
    QUARANTINE_ANNOTATIONS,
    REASON_MAX,
    RELEASED_REASON,
    TAINT_EFFECT,
    TAINT_KEY,
    Outcome,
    _check_names,
    _list,
    _map,
    _meta,
    _str_map,
    _What,
)
from trainmedic.timefmt import rfc3339

log = logging.getLogger("trainmedic.remediations.kube")


@dataclass(frozen=True, slots=True)
class QuarantineResult:
    """What `quarantine_node` did: `changed` is False when the node was already quarantined as asked;
    `already_by` names the other incident that quarantined it first (its annotations are kept);
    `incident` is the incident the node is now recorded under."""

    node: str
    changed: bool
    already_by: str | None = None
    incident: str | None = None


class NodeQuarantineMixin:
    """The node operations of KubeOps: quarantine and release (cordon, taint, label, annotations and
    the TrainmedicUnhealthy condition), claims written as annotations, node problems as conditions
    and Events, and the list of quarantined nodes. KubeOps inherits them; what they use of it (its
    reads, its call and its read-modify-write) is declared below for the type checker only, which
    checks KubeOps' own definitions against these declarations."""

    if TYPE_CHECKING:
        core: Any

        async def get_node(self, name: str) -> JSON | None: ...

        async def list_nodes(self, *, label_selector: Mapping[str, str] | None = None) -> list[JSON]: ...

        async def _request(
            self,
            what: _What,
            fn: Callable[..., Any],
            *args: Any,
            on_retry: Callable[[], None] | None = None,
            **kwargs: Any,
        ) -> JSON: ...

        async def _read_modify_write(
            self,
            read: Callable[[], Awaitable[JSON | None]],
            change: Callable[[JSON], JSON | None],
            write: Callable[[JSON], Awaitable[JSON]],
            what: _What,
            *,
            missing_ok: bool = False,
            first: JSON | None = None,
        ) -> Outcome: ...

    # -- nodes: quarantine and release -------------------------------------------------------------

    async def quarantine_node(
        self, node: str, *, incident_id: str, fault_class: FaultClass | str, reason: str
    ) -> QuarantineResult:
        """Keep new pods off a node: cordon, taint, label, annotate, and a node condition.

        Idempotent: what is already in place is not written again. A node quarantined by another
        incident keeps that incident's annotations (returned as `already_by`); missing pieces are
        restored. What the node was before (cordoned by a person or not) is recorded once.
        """
        fault = str(fault_class)
        if not incident_id:
            raise PermanentKubeError(f"quarantine {node}: an incident id is required")
        if not fault or not _LABEL_VALUE.match(fault):
            raise PermanentKubeError(f"quarantine {node}: {fault!r} cannot be a taint value")
        seen: dict[str, Any] = {}

        def change_spec(obj: JSON) -> JSON | None:
            meta, spec = _meta(obj), _map(obj.get("spec"))
            labels, ann = _str_map(meta.get("labels")), _str_map(meta.get("annotations"))
            owner = ann.get(ANN_INCIDENT)
            already_by = owner if owner and owner != incident_id else None
            seen["already_by"] = already_by
            seen["incident"] = owner or incident_id
            patch: JSON = {}
            wanted_ann = {
                ANN_INCIDENT: owner or incident_id,
                ANN_QUARANTINED_AT: ann.get(ANN_QUARANTINED_AT) or rfc3339(),
                ANN_QUARANTINE_REASON: ann.get(ANN_QUARANTINE_REASON) or _bounded(reason),
                ANN_WAS_UNSCHEDULABLE: ann.get(ANN_WAS_UNSCHEDULABLE) or str(spec.get("unschedulable") is True).lower(),
            }
            new_ann = {k: v for k, v in wanted_ann.items() if ann.get(k) != v}
            meta_patch: JSON = {}
            if new_ann:
                meta_patch["annotations"] = new_ann
            if labels.get(LABEL_QUARANTINED) != "true":
                meta_patch["labels"] = {LABEL_QUARANTINED: "true"}
            if meta_patch:
                patch["metadata"] = meta_patch
            spec_patch: JSON = {}
            if spec.get("unschedulable") is not True:
                spec_patch["unschedulable"] = True
            taints = [t for t in _list(spec.get("taints")) if isinstance(t, dict)]
            ours = next((t for t in taints if _is_our_taint(t)), None)
            seen["fault"] = str(ours.get("value")) if ours is not None and already_by else fault
            if ours is None:
                spec_patch["taints"] = [*taints, {"key": TAINT_KEY, "value": fault, "effect": TAINT_EFFECT}]
            elif not already_by and ours.get("value") != fault:
                spec_patch["taints"] = [dict(t, value=fault) if t is ours else t for t in taints]
            if spec_patch:
                patch["spec"] = spec_patch
            return patch or None

        # The node as last seen (read, or the spec patch's answer): the status step starts from it
        # rather than reading the node once more.
        last: dict[str, JSON] = {}

        async def get() -> JSON | None:
            obj = await self.get_node(node)
            if obj is not None:
                last["node"] = obj
            return obj

        async def write_spec(patch: JSON) -> JSON:
            obj = await self._request(patch_what, self.core.patch_node, node, patch, _content_type=MERGE_PATCH)
            if isinstance(obj, dict) and obj.get("metadata"):
                last["node"] = obj
            return obj

        patch_what = _What("patch", NODES, name=node)
        outcome = await self._read_modify_write(get, change_spec, write_spec, patch_what)
        changed = outcome == "written"

        def change_status(obj: JSON) -> JSON | None:
            conds = [c for c in _list(_map(obj.get("status")).get("conditions")) if isinstance(c, dict)]
            ours = next((c for c in conds if c.get("type") == CONDITION_TYPE), None)
            if ours is not None and ours.get("status") == "True":
                return None
            ann = _str_map(_meta(obj).get("annotations"))
            now = rfc3339()
            cond = {
                "type": CONDITION_TYPE,
                "status": "True",
                "reason": fault_reason(str(seen.get("fault") or fault)),
                "message": _bounded(
                    f"quarantined by trainmedic, incident {ann.get(ANN_INCIDENT) or incident_id}: "
                    f"{ann.get(ANN_QUARANTINE_REASON) or reason}"
                ),
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            return {"status": {"conditions": _replace_condition(conds, cond)}}

        status_what = _What("patch", NODES, name=node, sub="status")
        outcome = await self._read_modify_write(
            get,
            change_status,
            lambda patch: self._request(
                status_what, self.core.patch_node_status, node, patch, _content_type=MERGE_PATCH
            ),
            status_what,
            first=last.get("node"),
        )
        changed = changed or outcome == "written"
        already_by = seen.get("already_by")
        if already_by:
            log.info("node %s is already quarantined by incident %s (asked by %s)", node, already_by, incident_id)
        return QuarantineResult(node, changed, already_by, seen.get("incident"))

    async def annotate_node(self, node: str, name: str, value: str | None) -> None:
        """Set (or, with None, remove) one annotation of a node, leaving the rest alone (a merge patch:
        no read first, so it is one round trip; the circuit breaker's claims are written this way)."""
        _check_names(node=node)
        what = _What("patch", NODES, name=node)
        patch = {"metadata": {"annotations": {name: value}}}
        await self._request(what, self.core.patch_node, node, patch, _content_type=MERGE_PATCH)

    async def release_node(self, node: str, *, incident_id: str | None = None) -> bool:
        """Undo exactly what `quarantine_node` did: our taint, label and annotations go, the condition
        turns False (Released), and the node is uncordoned only if it was schedulable before.
        False when the node is not quarantined (or gone). With `incident_id`, a node quarantined by
        another incident is refused (ReleaseRefused)."""
        get = lambda: self.get_node(node)  # noqa: E731
        found: dict[str, bool] = {}

        def change_spec(obj: JSON) -> JSON | None:
            meta, spec = _meta(obj), _map(obj.get("spec"))
            labels, ann = _str_map(meta.get("labels")), _str_map(meta.get("annotations"))
            taints = [t for t in _list(spec.get("taints")) if isinstance(t, dict)]
            conds = _list(_map(obj.get("status")).get("conditions"))
            ours_cond = any(
                isinstance(c, dict)
                and c.get("type") in (CONDITION_TYPE, *PROBLEM_CONDITIONS)
                and c.get("status") == "True"
                for c in conds
            )
            quarantined = (
                LABEL_QUARANTINED in labels
                or any(k in ann for k in QUARANTINE_ANNOTATIONS)
                or any(_is_our_taint(t) for t in taints)
                or ours_cond
            )
            found["quarantined"] = quarantined
            if not quarantined:
                return None
            owner = ann.get(ANN_INCIDENT)
            if incident_id is not None and owner and owner != incident_id:
                raise ReleaseRefused(
                    f"release {node}: quarantined by incident {owner}, not {incident_id}",
                    hint=I18nText(
                        en=f"Node {node} was quarantined by incident {owner}; release it from that incident.",
                        zh=f"节点 {node} 由事件 {owner} 隔离，请从该事件解除隔离。",
                    ),
                )
            patch: JSON = {}
            meta_patch: JSON = {}
            drop_ann = {k: None for k in QUARANTINE_ANNOTATIONS if k in ann}
            if drop_ann:
                meta_patch["annotations"] = drop_ann
            if LABEL_QUARANTINED in labels:
                meta_patch["labels"] = {LABEL_QUARANTINED: None}
            if meta_patch:
                patch["metadata"] = meta_patch
            spec_patch: JSON = {}
            kept = [t for t in taints if not _is_our_taint(t)]
            if len(kept) != len(taints):
                spec_patch["taints"] = kept or None
            was = ann.get(ANN_WAS_UNSCHEDULABLE)
            if was == "false" and spec.get("unschedulable"):
                spec_patch["unschedulable"] = None
            elif was is None and spec.get("unschedulable"):
                log.warning("node %s: %s is missing; leaving it cordoned", node, ANN_WAS_UNSCHEDULABLE)
            if spec_patch:
                patch["spec"] = spec_patch
            return patch or None

        patch_what = _What("patch", NODES, name=node)
        outcome = await self._read_modify_write(
            get,
            change_spec,
            lambda patch: self._request(patch_what, self.core.patch_node, node, patch, _content_type=MERGE_PATCH),
            patch_what,
            missing_ok=True,
        )
        if outcome == "missing" or not found.get("quarantined"):
            return False

        def change_status(obj: JSON) -> JSON | None:
            conds = [c for c in _list(_map(obj.get("status")).get("conditions")) if isinstance(c, dict)]
            ours = [
                c
                for c in conds
                if c.get("type") in (CONDITION_TYPE, *PROBLEM_CONDITIONS) and c.get("status") != "False"
            ]
            if not ours:
                return None
            now = rfc3339()
            for c in ours:
                cond = {
                    "type": c["type"],
                    "status": "False",
                    "reason": RELEASED_REASON,
                    "message": "released by trainmedic"
                    + (f" (incident {incident_id})" if incident_id else "")
                    + " / 已由 trainmedic 解除隔离",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
                conds = _replace_condition(conds, cond)
            cleared.extend(str(c["type"]) for c in ours)
            return {"status": {"conditions": conds}}

        cleared: list[str] = []
        status_what = _What("patch", NODES, name=node, sub="status")
        await self._read_modify_write(
            get,
            change_status,
            lambda patch: self._request(
                status_what, self.core.patch_node_status, node, patch, _content_type=MERGE_PATCH
            ),
            status_what,
            missing_ok=True,
        )
        if any(t in PROBLEM_CONDITIONS for t in cleared):
            await self.node_event(
                node,
                key=f"released-{incident_id or 'manual'}",
                event_type="Normal",
                reason="TrainmedicNodeReleased",
                message="released by trainmedic: the node takes new pods again / "
                "已由 trainmedic 解除隔离，节点重新接收新 Pod",
                best_effort=True,
            )
        return True

    async def report_node_problem(
        self, node: str, *, incident_id: str, fault_class: FaultClass | str, message: I18nText
    ) -> bool:
        """A node-level fault as node-problem-detector reports one: the condition of its kind
        (problem_condition) set True with the fault class as reason and the message in both languages,
        and a Warning Event on the Node. Idempotent per incident (the condition is rewritten only when
        it changes; the Event has a name per incident). False when the node is gone."""
        fault = str(fault_class)
        kind = problem_condition(fault)
        reason = fault_reason(fault)
        text = _bounded(f"{message.en} / {message.zh} (trainmedic incident {incident_id})")

        def change_status(obj: JSON) -> JSON | None:
            conds = [c for c in _list(_map(obj.get("status")).get("conditions")) if isinstance(c, dict)]
            ours = next((c for c in conds if c.get("type") == kind), None)
            if ours is not None and (ours.get("status"), ours.get("reason"), ours.get("message")) == (
                "True",
                reason,
                text,
            ):
                return None
            now = rfc3339()
            was_true = ours is not None and ours.get("status") == "True"
            cond = {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": text,
                "lastHeartbeatTime": now,
                "lastTransitionTime": (ours or {}).get("lastTransitionTime") if was_true else now,
            }
            return {"status": {"conditions": _replace_condition(conds, cond)}}

        status_what = _What("patch", NODES, name=node, sub="status")
        outcome = await self._read_modify_write(
            lambda: self.get_node(node),
            change_status,
            lambda patch: self._request(
                status_what, self.core.patch_node_status, node, patch, _content_type=MERGE_PATCH
            ),
            status_what,
            missing_ok=True,
        )
        if outcome == "missing":
            return False
        await self.node_event(node, key=incident_id, event_type="Warning", reason=reason, message=text)
        return outcome == "written"

    async def node_event(
        self,
        node: str,
        *,
        key: str,
        event_type: Literal["Normal", "Warning"],
        reason: str,
        message: str,
        best_effort: bool = False,
    ) -> bool:
        """An Event about the Node (core/v1, in `default`, as the kubelet and node-problem-detector
        write them): `kubectl describe node` shows it. One per `key`: a retry finds its own (409).
        With `best_effort`, a failure is logged instead of raised (a release must not fail on it)."""
        now = rfc3339()
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": _event_name(node, key), "namespace": NODE_EVENT_NAMESPACE},
            # node-problem-detector's convention: a Node's uid in its events is its name.
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "type": event_type,
            "reason": reason,
            "message": _bounded(message),
            "source": {"component": EVENT_COMPONENT, "host": node},
            "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        what = _What("create", EVENTS, NODE_EVENT_NAMESPACE, name=body["metadata"]["name"])
        try:
            await self._request(what, self.core.create_namespaced_event, NODE_EVENT_NAMESPACE, body)
        except ConflictError:
            return False  # already written (a retry, or the same incident again)
        except KubeError as e:
            if not best_effort:
                raise
            log.warning("node %s: the %s event was not written: %s", node, reason, e)
            return False
        return True

    async def quarantined_nodes(self) -> list[JSON]:
        """Nodes carrying our quarantine label: name, incident, reason, since, fault class, cordon."""
        out: list[JSON] = []
        for n in await self.list_nodes(label_selector={LABEL_QUARANTINED: "true"}):
            meta, spec = _meta(n), _map(n.get("spec"))
            ann = _str_map(meta.get("annotations"))
            taint = next((t for t in _list(spec.get("taints")) if isinstance(t, dict) and _is_our_taint(t)), None)
            out.append(
                {
                    "name": str(meta.get("name") or ""),
                    "incident": ann.get(ANN_INCIDENT),
                    "reason": ann.get(ANN_QUARANTINE_REASON),
                    "since": ann.get(ANN_QUARANTINED_AT),
                    "fault_class": None if taint is None else taint.get("value"),
                    "unschedulable": spec.get("unschedulable") is True,
                }
            )
        return sorted(out, key=lambda x: str(x["name"]))


def fault_reason(fault_class: str) -> str:
    """A condition reason (CamelCase, as the API wants) from a fault class: device_error -> DeviceError."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", fault_class) if w]
    reason = "".join(w[:1].upper() + w[1:] for w in words)
    if not reason or not reason[0].isalpha():
        reason = "Fault" + reason
    return reason[:128]


def _bounded(text: str, limit: int = REASON_MAX) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _is_our_taint(t: Mapping[str, Any]) -> bool:
    return t.get("key") == TAINT_KEY and t.get("effect") == TAINT_EFFECT


def _replace_condition(conds: Sequence[JSON], cond: JSON) -> list[JSON]:
    """The conditions with ours (of `cond`'s type) replaced in place (or appended); everyone else's
    kept as they are."""
    kind = cond.get("type")
    out = [cond if c.get("type") == kind else c for c in conds]
    if not any(c.get("type") == kind for c in conds):
        out.append(cond)
    return out


def problem_condition(fault_class: FaultClass | str) -> str:
    """The node-problem-detector style condition type of a node-level fault: the accelerator's own
    faults on TrainmedicAcceleratorProblem, the rest on TrainmedicNodeProblem."""
    return PROBLEM_ACCELERATOR if str(fault_class) in ACCELERATOR_FAULTS else PROBLEM_NODE


def _event_name(node: str, key: str) -> str:
    """A stable Event name per node and occurrence (a retried create finds its own: 409)."""
    safe = re.sub(r"[^a-z0-9.-]+", "-", f"{node}.trainmedic-{key}".lower()).strip("-.")
    return safe[:253]
