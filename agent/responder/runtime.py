"""What the actions run against, `RuntimeMixin` of Responder (core.py): an action's call
(`_run_action`, the action's own module in remediations/actions/ run against the incident's journal,
`_StoreJournal`) and the services it calls back (remediations/actions/base.py: Runtime): the
replacement body kept out of the incident store (mode 0600, checksummed), the workload and its pods,
a restart already under way, the scene's path, the policy's context and its thread, and the body
that replaces a workload (latest complete checkpoint, nodes to avoid, memory). The workload and pod
lookups and the policy context the rest of the responder uses are here too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from trainmedic.agent.responder.incidents import _annotation, _job_of, incident_findings
from trainmedic.agent.responder.settings import _RESTARTS, _UNSAFE_NAME, ResponderSettings
from trainmedic.agent.store import ActionRecord, ActionState, Incident, IncidentStore
from trainmedic.events import JobRef
from trainmedic.models import RootCause
from trainmedic.remediations import checkpoint_reader as reader
from trainmedic.remediations import checkpoints as ckpt
from trainmedic.remediations import workloads as wl
from trainmedic.remediations.actions import ACTIONS, ActionCall, Entry
from trainmedic.remediations.actions.quarantine_node import pool_nodes
from trainmedic.remediations.actions.restart_from_checkpoint import lineage_restarts
from trainmedic.remediations.errors import PermanentActionError
from trainmedic.remediations.kube import KubeError, KubeOps, PermanentKubeError
from trainmedic.remediations.policy import RESERVATION_HOLD_S, ActionName, Policy, PolicyContext
from trainmedic.remediations.policy_state import PolicyState
from trainmedic.remediations.stacks import StackSource

log = logging.getLogger("trainmedic.responder")
P = ParamSpec("P")
T = TypeVar("T")

# A reader pod's listing is used again for the same incident this long (the scene, then the restart),
# for at most this many incidents (the oldest forgotten first: `responder_reader_listings`).
_READER_KEEP_S = 600.0
_READER_KEEP_MAX = 256

# The workload kinds tried when a diagnosis names a job without its kind (a hang found by key).
_KINDS: tuple[tuple[str, str], ...] = (
    ("batch/v1", "Job"),
    ("batch.volcano.sh/v1alpha1", "Job"),
    ("kubeflow.org/v1", "PyTorchJob"),
)


class RuntimeMixin:
    """The services the actions call back, and the lookups behind them. Responder inherits it (and
    is the Runtime each action receives); what it uses of the other parts is declared below for the
    type checker only, which checks Responder's own definitions against these declarations."""

    if TYPE_CHECKING:
        kube: KubeOps
        store: IncidentStore
        policy: Policy
        policy_state: PolicyState
        settings: ResponderSettings
        clock: Callable[[], float]
        _policy_thread: concurrent.futures.ThreadPoolExecutor
        _reader_listings: dict[str, tuple[str, float, tuple[ckpt.Checkpoint, ...]]]

        @property
        def stack_source(self) -> StackSource: ...

    # -- an action's call, against the incident's journal --

    async def _run_action(self, incident: Incident, action: ActionRecord, rc: RootCause) -> None:
        """The action's own module runs it (remediations/actions), against this incident's journal."""
        entry = Entry(action.seq, action.name, action.state.value, dict(action.params), action.result)
        journal = _StoreJournal(self.store, incident.id)
        await ACTIONS[action.name].run(ActionCall(journal, entry, rc, _job_of(incident), self))

    # -- the replacement body, kept out of the incident store --

    @property
    def body_dir(self) -> Path:
        return self.settings.body_dir or self.settings.scene_dir.parent / "restart-bodies"

    def save_body(self, incident_id: str, seq: int, body: Mapping[str, Any]) -> dict[str, Any]:
        """Write the full body durably (0600) before the journal says `deleting`; the reference."""
        self.body_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = f"{_UNSAFE_NAME.sub('_', incident_id)[:200]}.{seq}.json"
        data = json.dumps(body, ensure_ascii=False, sort_keys=True).encode()
        tmp = self.body_dir / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.body_dir / name)
        with contextlib.suppress(OSError):
            dfd = os.open(self.body_dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return {"file": name, "sha256": hashlib.sha256(data).hexdigest()}

    def _drop_bodies(self, names: set[str], *, keep: bool) -> None:
        """Remove the replacement bodies (and half-written ones) of the incidents named (by their
        file-safe id); with `keep`, of every incident but those."""
        try:
            files = list(self.body_dir.iterdir())
        except OSError:
            return
        for f in files:
            stem = f.name.removeprefix(".").removesuffix(".tmp")
            parts = stem.rsplit(".", 2)
            if len(parts) != 3 or parts[2] != "json":
                continue
            if (parts[0] in names) is not keep:
                with contextlib.suppress(OSError):
                    f.unlink()

    def body_path(self, params: Mapping[str, Any]) -> Path | None:
        ref = params.get("body_ref")
        return self.body_dir / str(ref["file"]) if ref else None

    def load_body(self, params: Mapping[str, Any]) -> dict[str, Any]:
        path = self.body_path(params)
        if path is None:
            return dict(params["body"])  # a journal written before bodies were kept apart
        ref = params["body_ref"]
        try:
            data = path.read_bytes()
        except OSError as e:
            raise PermanentActionError(
                f"the replacement body {path} is unreadable ({e}); the job was deleted: recreate it by hand from "
                "the redacted body in the incident and the scene's objects"
            ) from e
        if hashlib.sha256(data).hexdigest() != ref.get("sha256"):
            raise PermanentActionError(f"the replacement body {path} does not match its journal checksum")
        body: dict[str, Any] = json.loads(data)
        return body

    def drop_body(self, params: Mapping[str, Any]) -> None:
        ref = params.get("body_ref")
        if ref:
            with contextlib.suppress(OSError):
                (self.body_dir / str(ref["file"])).unlink()

    async def find_workload(self, job: JobRef) -> dict[str, Any] | None:
        return await self._workload(job)

    async def restart_under_way(self, job: JobRef, incident_id: str) -> str | None:
        return await asyncio.to_thread(
            self.store.restarting, job.namespace, job.name, besides=incident_id, actions=_RESTARTS
        )

    async def job_pods(self, job: JobRef) -> list[dict[str, Any]]:
        return await self._pods(job, await self._workload(job))

    async def scene_path(self, incident_id: str) -> Path | None:
        scene = (await asyncio.to_thread(self.store.get, incident_id)).scene_dir
        return Path(scene) if scene else None

    async def policy_context(self, incident_id: str, rc: RootCause) -> PolicyContext:
        return self._ctx_light(await asyncio.to_thread(self.store.get, incident_id), rc)

    async def in_policy(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        fut = asyncio.get_running_loop().run_in_executor(self._policy_thread, functools.partial(fn, *args, **kwargs))
        return await asyncio.shield(fut)

    async def replacement(
        self, incident_id: str, live: dict[str, Any], rc: RootCause
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The body that replaces `live`, and what went into it (checkpoint, excluded nodes, memory)."""
        checkpoint = ckpt.latest_of(await self.checkpoints_of(live, incident_id))
        exclude = set(await self._bad_nodes(incident_id, rc))
        memory: dict[str, Any] = {}
        for a in self.store.get(incident_id).actions:
            if a.name == ActionName.RAISE_MEMORY_LIMIT.value and a.params.get("max_bytes"):
                memory = {"memory_factor": float(a.params["factor"]), "memory_cap_bytes": int(a.params["max_bytes"])}
            exclude.update(str(n) for n in a.params.get("exclude_nodes") or [])
        body = wl.recreate_body(
            live,
            incident_id=incident_id,
            checkpoint=checkpoint,
            exclude_nodes=sorted(exclude),
            now=self.clock(),
            **memory,
        )
        excluded = _annotation(body, "trainmedic.io/excluded-nodes")
        return body, {
            "checkpoint": checkpoint.path if checkpoint else None,
            "step": checkpoint.step if checkpoint else None,
            "excluded_nodes": excluded.split(",") if excluded else [],
            "memory": memory or None,
        }

    async def _bad_nodes(self, incident_id: str, rc: RootCause) -> list[str]:
        """Nodes the replacement must avoid: the ones this incident quarantined, and every node
        trainmedic holds in quarantine (the taint keeps pods off them too; affinity says it again)."""
        nodes = set()
        for a in self.store.get(incident_id).actions:
            if a.name == ActionName.QUARANTINE_NODE.value and a.state is ActionState.DONE and a.result:
                node = a.result.get("node")
                if node:
                    nodes.add(str(node))
        with contextlib.suppress(KubeError):
            nodes.update(str(n["name"]) for n in await self.kube.quarantined_nodes())
        return sorted(nodes)

    async def checkpoints_of(self, workload: Mapping[str, Any], incident_id: str) -> list[ckpt.Checkpoint]:
        """The checkpoints under the workload's declared checkpoint directory, with the paths the job
        sees: read here (through `checkpoint_path_map`, or at the same path), or by a reader pod in
        the job's namespace (remediations/checkpoint_reader.py) when `checkpoint_reader` says so. A
        reader's listing is kept for the incident a while (`_READER_KEEP_S`), so the scene and the
        restart do not start two pods; a reader that gives none is logged and noted on the incident,
        and the job is then treated as one with no checkpoint found."""
        root = wl.resume_spec(workload).checkpoint_dir
        if not root:
            return []
        local = self._map_path(root)
        image = self.settings.checkpoint_reader_image
        mode = self.settings.checkpoint_reader
        if not image or mode == "off" or (mode == "auto" and await asyncio.to_thread(os.path.isdir, local)):
            found = await asyncio.to_thread(ckpt.list_checkpoints, local)
            if local == root:
                return found
            return [dataclasses.replace(c, path=root + c.path[len(local) :]) for c in found]
        now = self.clock()
        kept = self._reader_listings.get(incident_id)
        if kept is not None and kept[0] == root and now - kept[1] < _READER_KEEP_S:
            return list(kept[2])
        try:
            found = await reader.read_checkpoints(
                self.kube,
                workload,
                root,
                image=image,
                incident_id=incident_id,
                timeout_s=self.settings.checkpoint_reader_timeout_s,
            )
        except (reader.CheckpointsUnreachable, reader.CheckpointReadError, KubeError) as exc:
            log.warning("incident %s: the checkpoints under %s were not read: %s", incident_id, root, exc)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    self.store.note, incident_id, "checkpoints_unread", {"root": root, "reason": str(exc)[:500]}
                )
            return []
        self._reader_listings[incident_id] = (root, now, tuple(found))
        while len(self._reader_listings) > _READER_KEEP_MAX:
            self._reader_listings.pop(next(iter(self._reader_listings)))
        return found

    def _map_path(self, path: str) -> str:
        for prefix, local in sorted(self.settings.checkpoint_path_map.items(), key=lambda kv: -len(kv[0])):
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                return local.rstrip("/") + path[len(prefix.rstrip("/")) :]
        return path

    # -- lookups ----------------------------------------------------------------------------------------

    async def _workload(self, job: JobRef) -> dict[str, Any] | None:
        kinds = [(job.api_version, job.kind)] + [k for k in _KINDS if k != (job.api_version, job.kind)]
        if job.kind == "Pod":
            return None
        for api_version, kind in kinds:
            try:
                obj = await self.kube.get_workload(api_version, kind, job.namespace, job.name)
            except PermanentKubeError:
                continue  # a CRD that is not installed
            if obj is not None:
                return obj
        return None

    async def _pods(self, job: JobRef, workload: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        if workload is None:
            return []
        try:
            return await self.kube.list_job_pods(job.namespace, wl.job_pod_selector(workload))
        except KubeError as e:
            log.warning("cannot list the pods of %s/%s: %s", job.namespace, job.name, e)
            return []

    async def _context(self, incident: Incident, rc: RootCause, workload: Mapping[str, Any] | None) -> PolicyContext:
        try:
            nodes = await pool_nodes(self.kube, self.policy, rc.node)
        except KubeError as e:
            log.warning("cannot list nodes for the circuit breaker: %s", e)
            nodes = []
        pool, pool_size = self.policy.pool_of(rc.node, nodes)
        quarantined = self.policy.pool_quarantined(rc.node, nodes) if nodes else None
        now = self.clock()
        # Claims in flight (a brain about to taint a node) hold their places at plan time too.
        claimed = frozenset(n for _, n in self.policy.pool_claims(rc.node, nodes, since=now - RESERVATION_HOLD_S))
        opt_out = workload is not None and wl.resume_spec(workload).opt_out
        texts = [f.text for f in (incident_findings(incident))]
        return PolicyContext(
            namespace=incident.namespace or "",
            job_key=incident.key,
            node=rc.node,
            device=rc.device,
            pool=pool,
            pool_size=pool_size,
            opt_out=opt_out,
            now=now,
            texts=tuple(texts),
            quarantined=quarantined,
            claimed=claimed - (quarantined or frozenset()),
            lineage_restarts=lineage_restarts(workload),
        )

    def _ctx_light(self, incident: Incident, rc: RootCause) -> PolicyContext:
        plan = incident.plan or {}
        ctx = plan.get("context") or {}
        return PolicyContext(
            namespace=incident.namespace or "",
            job_key=incident.key,
            node=rc.node,
            device=rc.device,
            pool=str(ctx.get("pool", "all")),
            pool_size=int(ctx.get("pool_size") or 1),
            opt_out=False,
            now=self.clock(),
        )


class _StoreJournal:
    """The incident store as an action's journal (remediations/actions/base.py: Journal)."""

    def __init__(self, store: IncidentStore, incident_id: str) -> None:
        self.store = store
        self.incident_id = incident_id

    async def entries(self) -> list[Entry]:
        actions = (await asyncio.to_thread(self.store.get, self.incident_id)).actions
        return [Entry(a.seq, a.name, a.state.value, dict(a.params), a.result) for a in actions]

    async def update(
        self, seq: int, state: str, *, params: Mapping[str, Any] | None = None, result: Mapping[str, Any] | None = None
    ) -> None:
        # Awaited before the action goes on: the step is on disk before the cluster changes.
        await asyncio.to_thread(
            self.store.update_action, self.incident_id, seq, ActionState(state), params=params, result=result
        )
