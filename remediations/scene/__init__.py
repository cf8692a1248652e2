"""Scene bundle ("保留现场"): the evidence of an incident, kept before anything is changed.

Remediation deletes pods and recreates workloads, and what they knew goes with them. So before any
action the responder saves one directory per incident, for the people who look into it later and
for tools that analyse it again (`trainmedic diagnose --scene DIR`):

    <root>/<incident_id>/
        manifest.json          every file with its size, sha256, line count, whether it was cut and
                               how many secrets were redacted; the job, the root cause; what could
                               not be collected and why; the limits used
        findings.json          the diagnosis (docs/contracts.md JSON), each finding with its place
                               and its evidence: the line in this bundle's own files where it is
        layout/<node>/rank<R>_<pod>_<container>.log (+ .previous.log after a restart)   the last N
                               lines of each container, one folder per node as collected logs
                               are laid out (`diagnose --logs` of the bundle places them too)
        events.yaml            core/v1 events about the job, its pods and their nodes
        objects/workload.yaml  the workload as it was: what a crashed restart recreates it from
        objects/pods/<pod>.yaml, objects/nodes/<node>.yaml
        layout/<node>/dmesg    the node's kernel lines around the fault, oldest first, beside its
                               containers' logs (manifest `kernel_sections`), so a bundle read as a
                               collected layout (`diagnose --logs`) names the node of a host fault as
                               `--scene` does; bundles written before keep them in one `kernel.log`
        metrics.json           the nodes' accelerator metrics before the fault
        checkpoints.json       the checkpoint listing
        stacks/<pod>.txt       for a hang: the Python stacks of the training processes, taken before
                               anything kills them (remediations.stacks)

Where each part lives:

    model.py    SCHEMA_VERSION, MANIFEST, SceneError, valid_bundle_name, SceneSource (where a scene
                reads from), SceneSettings, SceneInputs, SceneResult
    pods.py     accessors of API objects, the pods and their containers (pod_containers), ranks
                (pod_rank) and where a container's log goes (log_rel)
    redact.py   the redaction pass (redact_text, redact_object, warm_redactor, SECRET_FLAG): why a
                bundle is safe to hand around
    text.py     text cleaning (clean_log_text: last lines, file and line caps, valid UTF-8, redacted)
                and the order of events (event_order)
    writer.py   the writer of the partial bundle (its caps, its entries and problems) and the commit
                that renames it into place: why a bundle is atomic, bounded and best effort
    collect.py  save_scene: what is gathered (logs, events, metrics, kernel lines, objects, stacks)
    bundle.py   load_scene, LoadedScene and SceneLog: reading a saved bundle

The flow: `save_scene` (collect) reads the pods' logs, events, metrics, kernel lines, objects and
stacks; each text is cleaned (text) and redacted (redact) and written with its entry into
`<root>/.<incident_id>.partial/` (writer), and the manifest, written last, commits the bundle by a
rename (writer). `load_scene` (bundle) reads a committed bundle back.

This package re-exports what other modules import from `trainmedic.remediations.scene`.
"""

from __future__ import annotations

from trainmedic.remediations.scene.bundle import LoadedScene, SceneLog, load_scene
from trainmedic.remediations.scene.collect import _findings_doc as _findings_doc
from trainmedic.remediations.scene.collect import save_scene
from trainmedic.remediations.scene.model import (
    MANIFEST,
    SCHEMA_VERSION,
    SceneError,
    SceneInputs,
    SceneResult,
    SceneSettings,
    SceneSource,
    valid_bundle_name,
)
from trainmedic.remediations.scene.pods import log_rel, pod_containers, pod_rank
from trainmedic.remediations.scene.redact import _hs as _hs
from trainmedic.remediations.scene.redact import _Redactor as _Redactor
from trainmedic.remediations.scene.redact import _redactor as _redactor
from trainmedic.remediations.scene.redact import redact_object as redact_object
from trainmedic.remediations.scene.redact import redact_text
from trainmedic.remediations.scene.redact import warm_redactor as warm_redactor
from trainmedic.remediations.scene.text import clean_log_text, event_order

__all__ = [
    "MANIFEST",
    "SCHEMA_VERSION",
    "LoadedScene",
    "SceneError",
    "SceneInputs",
    "SceneLog",
    "SceneResult",
    "SceneSettings",
    "SceneSource",
    "clean_log_text",
    "event_order",
    "load_scene",
    "log_rel",
    "pod_containers",
    "pod_rank",
    "redact_text",
    "save_scene",
    "valid_bundle_name",
]
