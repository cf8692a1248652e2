"""The agent's HTTP API (FastAPI, served by uvicorn in the brain): probes, metrics, incidents, diagnose, alerts.

    GET  /healthz                                  liveness: the process answers (always cheap)
    GET  /readyz                                   readiness: 503 with the reasons until the agent is ready
    GET  /metrics                                  Prometheus exposition of the agent's own metrics
    GET  /api/v1/incidents?status=&limit=          recent incidents (newest first)
    GET  /api/v1/incidents/{id}                    one incident with its timeline (a unique id prefix works)
    GET  /api/v1/incidents/{id}/report?format=md|html&lang=en|zh
    POST /api/v1/incidents/{id}/approve|reject     {by, comment}: a person's decision on a pending plan
    POST /api/v1/diagnose                          uploaded logs -> the JSON of `trainmedic diagnose --format json`
    POST /api/v1/alertmanager                      Alertmanager webhook (payload version 4) -> input events
    /console/...                                   the web console (agent/console; not in the OpenAPI schema)

The parts (each module's docstring says why it is built the way it is):

* `errors`: `ApiError` and the JSON every error answer has (`{"error": <English>, "error_zh": <Chinese>,
  "code": <machine code>, "detail": ...}`), the texts for Starlette's own statuses, and `_known_query`
  (an undeclared query parameter is a 422, not silently ignored).
* `models`: the pydantic response and request models, that is the OpenAPI schema, and `_responses`.
* `guard`: `resolve_token`, `throttled` and `_Guard`, the ASGI middleware for bearer auth (constant
  time; refused, never open, when no token is configured), the wrong-token throttle and body limits.
* `uploads`: `POST /api/v1/diagnose`'s side: the uploaded logs read (`_read_logs`), gzip inflated
  with a bound (`_inflate`) and diagnosed with the CLI's core (`diagnose_blobs`).
* `app`: `create_app`, the app over the agent's parts (`_State`), with the routes registered by group
  (`_error_handlers`, `_probe_routes`, `_incident_routes`, `_diagnose_routes`, `_alert_routes`).
* `server`: `ApiServer` / `serve`, uvicorn on a socket bound here, without its signal handlers;
  `ApiBindError` when the address cannot be bound.
* The Alertmanager payload and its conversion into input events (`AlertmanagerWebhook`,
  `alert_events`, `topic_of`, `attach_jobs`) are the ingest side's: agent/watchers/alertmanager.py.
  The receiver route stays here and calls it.

A request's way through: uvicorn (`server`) -> `_Guard` (`guard`: the token where one is needed, the
wrong-token throttle, the body read in full under `api.max_body_bytes`) -> FastAPI's routing and
`_known_query` (`errors`) -> the route (`app`), which validates against `models` and answers with one
of them, or raises `ApiError`, which the app's error handlers turn into the JSON error body. Diagnose
calls `uploads` (the scan runs in a worker thread, one scan of an engine at a time); the Alertmanager
receiver converts with agent/watchers/alertmanager.py, hands the events to `ingest` and answers 5xx
when they cannot be handed on, so Alertmanager retries. The console (agent/console) is mounted under
/console and checks its own auth.

This package re-exports the names the rest of the agent and the tests use.
"""

from trainmedic.agent.api.app import create_app
from trainmedic.agent.api.guard import resolve_token
from trainmedic.agent.api.server import ApiBindError, ApiServer, serve
from trainmedic.agent.api.uploads import diagnose_blobs
from trainmedic.agent.watchers.alertmanager import AlertmanagerWebhook, alert_events, attach_jobs, topic_of

__all__ = [
    "AlertmanagerWebhook",
    "ApiBindError",
    "ApiServer",
    "alert_events",
    "attach_jobs",
    "create_app",
    "diagnose_blobs",
    "resolve_token",
    "serve",
    "topic_of",
]
