"""The responder: a diagnosis becomes an incident; the scene is saved, the policy decides, the cluster
is changed, safely.

    trainmedic.diagnoses --> incident (store) --> scene bundle --> policy plan --> actions --> trainmedic.incidents

Ownership. The responder is a consumer group over `trainmedic.diagnoses`, whose records are keyed by
job like every input event: the member that owns a job's partition is the only one that acts on the
job. Within a member, one serial worker per key (kopf's model): two incidents of one job never
race, incidents of different jobs run side by side.

Order of work for a final diagnosis with a root cause (earlier revisions only protect the job's pods
with the `trainmedic.io/scene` finalizer, so a failed pod is not cleaned away before its logs are
saved):

1. the incident is opened in the store (its id is the diagnosis id: a replay lands on it);
2. evidence first: the scene bundle (logs of every pod, events, objects, kernel lines, metrics,
   findings, checkpoint listing; stacks for a hang, before anything is killed); the finalizers are
   released once it is complete;
3. the policy decides (mode, budgets, backoff, frequency escalation, circuit breaker) and the plan is
   recorded with its actions, whatever the mode: observe / dry-run stop here, approve waits for a
   person (`trainmedic approve`), enforce goes on (a workload someone else is deleting is observed
   only, with no plan; a restart records the incarnation it is for, or that there was none);
4. each action runs in order, journalled in the store *before* the cluster changes; its code is
   its own module (remediations/actions/<name>.py, the registry `ACTIONS`): this package keeps the
   per-key queues and the incident's state machine. Restart from
   checkpoint records the replacement body, then `deleting`, deletes the original (uid precondition),
   waits until it is gone, records `creating`, creates the replacement. Killed at any point, the
   agent resumes the journal at start: the replacement is created exactly once (a 409 whose object
   carries this incident's annotation is success), and a workload that was never deleted is not
   touched twice.

Errors carry their meaning in their type (remediations/errors.py, `classify`): temporary (429, 5xx,
connection; a workload still terminating) leaves the action in its journal state, tried again after
its delay (escalated to a person past a deadline, the action's own or `retry_deadline_s` from its
first retry, still trying); blocked (the breaker or a budget refusing at the moment of acting) skips
the remaining changes and ends the incident `blocked`; a stale plan (the job was resubmitted since,
was absent when the plan was made, or someone else is deleting it) is cancelled and the incident
ends `observed`; permanent (RBAC forbidden, invalid, a workload another controller owns, any error
nobody expected) fails the action and the incident, which pages, except past a restart's delete
(`deleting`, `creating`): the job is gone and the saved body is its only full spec, so the error is
held (blocked, paged with the body's path, retried with backoff, the body kept). Nothing is left
`acting` and nothing is silently dropped: every step lands in the incident's timeline and on
`trainmedic.incidents`.

The parts, `Responder` being the core class and the mixins it inherits:

- `settings`: `ResponderSettings` (the `remediate` settings group) and the names the parts share;
- `core`: `Responder`'s state, the consume loop and the per-key work queue (`_Work`, `_KeyWorker`),
  with the bounds on work waiting and at work;
- `incidents`: `IncidentMixin`, the incident state machine (resume, approvals and retries, one
  diagnosis to its scene and plan, the node condition, the way out: `_finish`, `_publish`, the
  reports), with the helpers on incidents (`incident_findings`, `_stale`, `_annotation`, `_job_of`);
- `execute`: `ExecuteMixin`, an incident's actions run in order and each failure given its meaning;
- `runtime`: `RuntimeMixin`, an action's call against the incident's journal (`_StoreJournal`) and
  the services the actions call back (remediations/actions/base.py: Runtime), with the workload,
  pod and policy-context lookups;
- `scene`: `SceneMixin`, the scene bundle, the finalizer that keeps a job's pods until it is saved,
  the stack source, and `_SceneSource`, what the scene collector reads.

This package re-exports the names the rest of trainmedic and its tests import from it.
"""

from trainmedic.agent.responder.core import Responder
from trainmedic.agent.responder.core import _KeyWorker as _KeyWorker
from trainmedic.agent.responder.core import _Work as _Work
from trainmedic.agent.responder.execute import ExecuteMixin
from trainmedic.agent.responder.incidents import NODE_LEVEL_FAULTS, IncidentMixin, incident_findings
from trainmedic.agent.responder.incidents import _annotation as _annotation
from trainmedic.agent.responder.incidents import _job_of as _job_of
from trainmedic.agent.responder.incidents import _stale as _stale
from trainmedic.agent.responder.runtime import RuntimeMixin
from trainmedic.agent.responder.runtime import _StoreJournal as _StoreJournal
from trainmedic.agent.responder.scene import SCENE_FINALIZER, SceneMixin
from trainmedic.agent.responder.scene import _SceneSource as _SceneSource
from trainmedic.agent.responder.settings import MetricsRange, ResponderSettings

__all__ = [
    "NODE_LEVEL_FAULTS",
    "SCENE_FINALIZER",
    "ExecuteMixin",
    "IncidentMixin",
    "MetricsRange",
    "Responder",
    "ResponderSettings",
    "RuntimeMixin",
    "SceneMixin",
    "incident_findings",
]
