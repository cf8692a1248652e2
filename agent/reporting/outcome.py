"""The top block of a report: what happened, what trainmedic did, what a person must still do."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainmedic.agent.reporting.values import _RESTARTS, MAX_TOP_LINKS, _i18n, _str, _text_pair
from trainmedic.agent.store import Incident
from trainmedic.reports.report import LANGS, i18n, labels

# ------------------------------------------------------------------------------------------------
# The top block: the outcome, what trainmedic did, what a person must still do


def _fmt(group: str, key: str, **args: Any) -> dict[str, str]:
    """<group>.<key> in both languages; an argument may be a {"en", "zh"} pair."""
    entry = labels()[group][key]
    return {
        lang: entry[lang].format(**{k: (v[lang] if isinstance(v, Mapping) else v) for k, v in args.items()})
        for lang in LANGS
    }


def _outcome_kind(incident: Incident, restarted: bool) -> str:
    status = incident.status.value
    if status == "resolved":
        return "healed" if restarted else "not_restarted"
    if status == "observed":
        return "observe_only"
    if status in ("awaiting_approval", "failed", "rejected", "blocked"):
        return status
    return "acting"


def _outcome(
    incident: Incident,
    rc: Mapping[str, Any] | None,
    plan: Mapping[str, Any] | None,
    checkpoint: Mapping[str, Any],
    where: Mapping[str, Any],
    stacks: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """How the incident ended, in words a person reads first: the outcome, what trainmedic did (the
    node it quarantined, where the job resumed, from which checkpoint and step) and what a person
    must still do, each with its exact command. The advice depends on the fault class and the
    outcome only, so two incidents of one kind read the same."""
    done = {a.name: a for a in incident.actions if a.state.value == "done"}
    restarted = any(n in done for n in _RESTARTS)
    kind = _outcome_kind(incident, restarted)
    node = _str(where.get("node")) or incident.node
    did: list[dict[str, str]] = []
    quarantined: str | None = None
    q = done.get("quarantine_node")
    if q is not None:
        quarantined = _str((q.result or {}).get("node")) or _str(q.params.get("node")) or node
        if quarantined:
            did.append(_fmt("outcome", "did_quarantine", node=quarantined))
    restart = done.get("restart_from_checkpoint") or done.get("raise_memory_limit")
    if restart is not None:
        used = checkpoint.get("used") if checkpoint.get("kind") == "resumed" else None
        if isinstance(used, Mapping):
            excluded = [str(n) for n in (restart.result or {}).get("excluded_nodes") or []]
            step = used.get("step")
            did.append(
                _fmt(
                    "outcome",
                    "did_resume",
                    checkpoint=str(used.get("path")),
                    step=_fmt("outcome", "did_resume_step", step=step) if step is not None else "",
                    nodes=_fmt("outcome", "did_resume_nodes", nodes=", ".join(excluded)) if excluded else "",
                )
            )
        elif restart.name == "raise_memory_limit":
            did.append(_fmt("outcome", "did_memory"))
        else:
            did.append(_fmt("outcome", "did_scratch"))
    stacks_taken = done.get("dump_stacks")
    stack_files = (stacks_taken.result or {}).get("files") if stacks_taken is not None else None
    if isinstance(stack_files, list):
        # Before the restart line: the stacks are of the processes the restart then killed.
        did.insert(len(did) - (1 if restart is not None else 0), _fmt("outcome", "did_stacks", n=len(stack_files)))
    if not did:
        did.append(_fmt("outcome", "did_nothing"))

    job_ref = f"{incident.namespace}/{incident.job}" if incident.job else incident.key
    fault = i18n("fault_class", incident.fault_class) if incident.fault_class else _i18n("fault", "故障")
    label = i18n("outcome", kind)
    headline = _fmt("outcome", "headline", outcome=label, fault=fault, where=node or job_ref)

    now: list[dict[str, Any]] = []

    def add(key: str, command: str | None = None, links: Sequence[Mapping[str, Any]] = (), **args: Any) -> None:
        now.append({"text": _fmt("now", key, **args), "command": command, "links": [dict(x) for x in links]})

    if kind == "awaiting_approval":
        add("approve", f"trainmedic approve {incident.id}")
    elif kind == "observe_only":
        add("observe", mode=i18n("mode", incident.mode or "observe"))
    elif kind == "failed":
        add("failed", f"trainmedic incidents {incident.id}")
    elif kind == "blocked":
        add("blocked", reason=_text_pair((plan or {}).get("blocked")) or _i18n("-", "-"))
    elif kind == "acting":
        add("acting", f"trainmedic incidents {incident.id}")
    fault_class = incident.fault_class or "unknown"
    if fault_class == "hang":
        if stacks:
            # The state the job was in when it was killed first; the rest are under Saved stacks.
            before = [st for st in stacks if st["when"] == i18n("labels", "stacks_before_restart")]
            add("hang", links=(before or list(stacks))[:MAX_TOP_LINKS])
        else:
            add("hang_no_stacks")
    elif fault_class in labels()["now"]:
        add(fault_class, node=node or "-")
    if quarantined:
        add("release", f"trainmedic release-node {quarantined} --incident {incident.id}", node=quarantined)
    if kind == "healed" and incident.job:
        add("watch", f"kubectl -n {incident.namespace} get {(incident.job_kind or 'job').lower()} {incident.job}")
    elif kind in ("not_restarted", "observe_only", "failed", "rejected", "blocked") and incident.job:
        add("resubmit")
    return {"kind": kind, "label": label, "headline": headline, "did": did, "now": now}
