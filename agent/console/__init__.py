"""The web console: incidents, their pages and reports, approvals and node release, in a browser.

Served by the API under /console (server-rendered Jinja2 templates, one small script for live
updates, no build step). Its routes are left out of the OpenAPI schema; the API's middleware leaves
their auth to the console (agent/console/views.py), which accepts a signed session cookie (with a
CSRF token on every form) or the API's bearer token. See docs/console.md.
"""

from trainmedic.agent.console.views import ReleaseNode, mount_console

__all__ = ["ReleaseNode", "mount_console"]
