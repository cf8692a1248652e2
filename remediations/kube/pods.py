"""Pods trainmedic runs itself (the checkpoint reader, remediations/checkpoint_reader.py): create one
in a training namespace and delete it again. KubeOps inherits these; what they use of it (its call)
is declared for the type checker only, as in nodes.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from trainmedic.remediations.kube.errors import KubeNotFound, PermanentKubeError
from trainmedic.remediations.kube.resources import JSON, PODS, _check_names, _meta, _What


class PodRunMixin:
    """Create and delete the pods trainmedic runs itself."""

    if TYPE_CHECKING:
        core: Any

        async def _request(
            self,
            what: _What,
            fn: Callable[..., Any],
            *args: Any,
            on_retry: Callable[[], None] | None = None,
            **kwargs: Any,
        ) -> JSON: ...

    async def create_pod(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        """Create `body` (a Pod with its name set) in `namespace`; 409 raises ConflictError."""
        name = _meta(body).get("name")
        if not isinstance(name, str) or not name:
            raise PermanentKubeError("create_pod: the body has no metadata.name")
        _check_names(namespace=namespace, pod=name)
        return await self._request(
            _What("create", PODS, namespace, name), self.core.create_namespaced_pod, namespace, dict(body)
        )

    async def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod at once (grace period 0: it only reads); False when it was already gone."""
        _check_names(namespace=namespace, pod=name)
        try:
            await self._request(
                _What("delete", PODS, namespace, name),
                self.core.delete_namespaced_pod,
                name,
                namespace,
                grace_period_seconds=0,
            )
        except KubeNotFound:
            return False
        return True
