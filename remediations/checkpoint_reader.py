"""A job's checkpoints listed where its files are: a short-lived reader pod.

A restart resumes from the job's last complete checkpoint, so the responder must see the job's
checkpoint storage. Mounting every team's storage into the brain (`remediate.checkpoint_path_map`)
works on a small cluster and not beyond it. With `remediate.checkpoint_reader: pod` (or `auto`, when
the root is not visible here), the responder starts instead, in the job's namespace, a pod that
mounts the one volume holding the job's checkpoint root, read only and at the path the job's own
containers mount it, runs `trainmedic checkpoints ROOT --json` from trainmedic's image, and exits.
The brain reads the listing from the pod's log and deletes the pod. Each candidate is judged by the
same code as a local listing (remediations/checkpoints.py), only run where the files are, and the
paths it names are the job's own.

The pod: the volume is copied from the job's pod template (a PersistentVolumeClaim, NFS, CSI,
CephFS or GlusterFS volume: storage every node can reach; the claim made read only), `subPath`
kept; the pod-level user, group and fsGroup of the job's template, so it may read what the job
wrote; no ServiceAccount token, no privilege escalation, a read-only root filesystem, all
capabilities dropped, `activeDeadlineSeconds`, `restartPolicy: Never`, small requests. No
toleration: it never lands on a node trainmedic quarantined (nor, usually, on an accelerator node).

Refused, with the reason: a root on no volume of the job's pods, or on storage only one node has
(emptyDir, hostPath, a per-pod ephemeral claim: the files stayed on the node that ran the pod), or
behind a `subPathExpr`. A reader that does not finish in time, fails, or prints no listing raises
CheckpointReadError; the caller records why and goes on without a checkpoint, as with none found.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from trainmedic.errors import PermanentError
from trainmedic.remediations import workloads as wl
from trainmedic.remediations.checkpoints import FORMATS, Checkpoint

__all__ = [
    "CONTAINER",
    "LISTING_KEY",
    "READER_LABEL",
    "SHARED_VOLUMES",
    "CheckpointReadError",
    "CheckpointsUnreachable",
    "parse_listing",
    "read_checkpoints",
    "reader_pod",
    "render_listing",
]

READER_LABEL = "trainmedic.io/checkpoint-reader"
CONTAINER = "reader"
# The one line of a reader's log that is its listing starts with this key.
LISTING_KEY = "trainmedic_checkpoints"
LISTING_VERSION = 1
# Volume sources on storage that outlives a pod and that any node can mount.
SHARED_VOLUMES = ("persistentVolumeClaim", "nfs", "csi", "cephfs", "glusterfs")
# A listing of 10,000 candidates is about 2.5 MB of JSON.
MAX_LOG_BYTES = 8 * 1024 * 1024
# The pod-level settings copied from the job's template: who the files were written as.
_POD_SECURITY = ("runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "supplementalGroups")
_NAME_PART = re.compile(r"[^a-z0-9]+")


class CheckpointsUnreachable(PermanentError):
    """The job's checkpoint root is on no volume a reader pod can mount."""


class CheckpointReadError(PermanentError):
    """The reader pod did not produce a listing (timeout, failure, unreadable output)."""


class PodRunner(Protocol):
    """What read_checkpoints uses of KubeOps."""

    async def create_pod(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def pod_log(
        self, namespace: str, pod: str, container: str, *, tail_lines: int = ..., limit_bytes: int | None = ...
    ) -> str: ...

    async def delete_pod(self, namespace: str, name: str) -> bool: ...


# -- the listing on the wire -------------------------------------------------------------------------


def render_listing(root: str, found: Sequence[Checkpoint]) -> str:
    """The one-line JSON document `trainmedic checkpoints ROOT --json` prints."""
    doc = {LISTING_KEY: LISTING_VERSION, "root": root, "checkpoints": [c.as_dict() for c in found]}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def parse_listing(text: str, root: str) -> list[Checkpoint]:
    """The checkpoints of a reader's log: its last listing line for `root` (other lines, such as a
    library's warnings, are passed over). Raises CheckpointReadError when there is none or it is
    malformed."""
    head = '{"' + LISTING_KEY + '":'
    for raw in reversed(text.splitlines()):
        line = raw.strip()
        if not line.startswith(head):
            continue
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise CheckpointReadError(f"the reader's listing is not JSON: {exc}") from exc
        version = doc.get(LISTING_KEY) if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or version != LISTING_VERSION:
            raise CheckpointReadError(f"the reader's listing has version {version!r}, not {LISTING_VERSION}")
        if doc.get("root") != root:
            raise CheckpointReadError(f"the reader listed {doc.get('root')!r}, not {root!r}")
        items = doc.get("checkpoints")
        if not isinstance(items, list):
            raise CheckpointReadError("the reader's listing has no list of checkpoints")
        return [_checkpoint(item, root) for item in items]
    raise CheckpointReadError("the reader's log holds no listing")


def _checkpoint(item: object, root: str) -> Checkpoint:
    if not isinstance(item, dict):
        raise CheckpointReadError("a listed checkpoint is not an object")
    try:
        c = Checkpoint(**item)
    except TypeError as exc:
        raise CheckpointReadError(f"a listed checkpoint has the wrong fields: {exc}") from exc
    checks = (
        isinstance(c.path, str) and (c.path == root or c.path.startswith(root.rstrip("/") + "/")),
        c.step is None or (isinstance(c.step, int) and not isinstance(c.step, bool)),
        c.format in FORMATS,
        isinstance(c.complete, bool),
        c.reason is None or isinstance(c.reason, str),
        c.reason_zh is None or isinstance(c.reason_zh, str),
        isinstance(c.mtime, int | float) and not isinstance(c.mtime, bool),
        isinstance(c.size_bytes, int) and not isinstance(c.size_bytes, bool),
    )
    if not all(checks):
        raise CheckpointReadError(f"a listed checkpoint is malformed: {str(item)[:200]}")
    return c


# -- the pod ----------------------------------------------------------------------------------------


def reader_pod(
    workload: Mapping[str, Any], root: str, *, image: str, incident_id: str, timeout_s: float
) -> dict[str, Any]:
    """The reader pod for `workload`'s checkpoint root `root` (see the module's docstring)."""
    template, mount, volume = _volume_for(workload, root)
    source = next((k for k in volume if k != "name"), "")
    if source not in SHARED_VOLUMES:
        raise CheckpointsUnreachable(
            f"{root} is on a {source or 'typeless'} volume ({volume.get('name')}): only the node that ran"
            f" the job's pod has those files (a reader can mount {', '.join(SHARED_VOLUMES)})"
        )
    if mount.get("subPathExpr"):
        raise CheckpointsUnreachable(
            f"{root} is mounted with a subPathExpr, which only the job's own container can expand"
        )
    volume = copy.deepcopy(volume)
    if source == "persistentVolumeClaim":
        volume[source]["readOnly"] = True
    reader_mount: dict[str, Any] = {"name": volume["name"], "mountPath": mount["mountPath"], "readOnly": True}
    if mount.get("subPath"):
        reader_mount["subPath"] = mount["subPath"]
    spec = template.get("spec") or {}
    pod_security = {k: v for k, v in (spec.get("securityContext") or {}).items() if k in _POD_SECURITY}
    namespace = str((workload.get("metadata") or {}).get("namespace") or "default")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": _pod_name(incident_id),
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "trainmedic",
                "app.kubernetes.io/component": "checkpoint-reader",
                READER_LABEL: "true",
            },
            "annotations": {"trainmedic.io/incident": incident_id, "trainmedic.io/checkpoint-dir": root},
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": max(1, int(timeout_s)),
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": pod_security,
            "volumes": [volume],
            "containers": [
                {
                    "name": CONTAINER,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["trainmedic", "checkpoints", root, "--json"],
                    "volumeMounts": [reader_mount],
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def _volume_for(workload: Mapping[str, Any], root: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The pod template, the volume mount and the volume under which the job's containers see `root`:
    the mount with the longest mountPath that holds it."""
    best: tuple[int, dict[str, Any], dict[str, Any]] | None = None
    for template in wl.pod_templates(workload):
        spec = template.get("spec") or {}
        for container in spec.get("containers") or []:
            for mount in container.get("volumeMounts") or []:
                path = str(mount.get("mountPath") or "")
                base = path.rstrip("/") or "/"
                inside = root == base or root.startswith(base.rstrip("/") + "/")
                if path and inside and (best is None or len(base) > best[0]):
                    best = (len(base), template, mount)
    if best is None:
        raise CheckpointsUnreachable(f"{root} is on no volume the job's containers mount")
    _, template, mount = best
    volumes = (template.get("spec") or {}).get("volumes") or []
    volume = next((v for v in volumes if isinstance(v, dict) and v.get("name") == mount.get("name")), None)
    if volume is None:
        raise CheckpointsUnreachable(
            f"{root}: the job's pod template mounts a volume {mount.get('name')!r} it does not declare"
        )
    return template, mount, volume


def _pod_name(incident_id: str) -> str:
    part = _NAME_PART.sub("-", incident_id.lower()).strip("-")[:30].strip("-")
    return f"trainmedic-ckpt-{part}-{secrets.token_hex(3)}" if part else f"trainmedic-ckpt-{secrets.token_hex(3)}"


# -- running it -------------------------------------------------------------------------------------


async def read_checkpoints(
    kube: PodRunner,
    workload: Mapping[str, Any],
    root: str,
    *,
    image: str,
    incident_id: str,
    timeout_s: float = 120.0,
    poll_s: float = 1.0,
) -> list[Checkpoint]:
    """Run a reader pod for `workload`'s checkpoint root and return its listing; the pod is deleted
    whatever happens. Raises CheckpointsUnreachable, CheckpointReadError, or the Kubernetes layer's
    errors (KubeError) as they come."""
    body = reader_pod(workload, root, image=image, incident_id=incident_id, timeout_s=timeout_s)
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    await kube.create_pod(namespace, body)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            pod = await kube.get_pod(namespace, name)
            if pod is None:
                raise CheckpointReadError(f"the reader pod {namespace}/{name} was deleted before it finished")
            phase = str((pod.get("status") or {}).get("phase") or "Pending")
            if phase in ("Succeeded", "Failed"):
                break
            if loop.time() >= deadline:
                raise CheckpointReadError(
                    f"the reader pod {namespace}/{name} did not finish in {timeout_s:g} s ({phase}{_waiting(pod)})"
                )
            await asyncio.sleep(poll_s)
        text = await kube.pod_log(namespace, name, CONTAINER, tail_lines=100_000, limit_bytes=MAX_LOG_BYTES)
        if phase == "Failed":
            last = " | ".join(text.strip().splitlines()[-3:])[:400]
            raise CheckpointReadError(
                f"the reader pod {namespace}/{name} failed{_terminated(pod)}: {last or 'no output'}"
            )
        return parse_listing(text, root)
    finally:
        with contextlib.suppress(Exception):
            await kube.delete_pod(namespace, name)


def _waiting(pod: Mapping[str, Any]) -> str:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return f", {waiting['reason']}"
    return ""


def _terminated(pod: Mapping[str, Any]) -> str:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (status.get("state") or {}).get("terminated") or {}
        if "exitCode" in term:
            return f" (exit {term['exitCode']}{', ' + str(term['reason']) if term.get('reason') else ''})"
    return ""
