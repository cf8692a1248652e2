"""The live cluster's access for `diagnose --job` and `scan`: the limits, `LiveError` and what causes
one (no kubeconfig, forbidden, a failed request), the API client from the kubeconfig, the job
reference parsed, and the read-only operations (`ReadOps`).
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, TypeVar

from trainmedic.agent.watchers.k8s import DaemonThreadExecutor
from trainmedic.errors import TrainmedicError
from trainmedic.models import I18nText
from trainmedic.remediations.kube import JOBS, PODS, KubeError, KubeForbidden, KubeOps, _check_names, _Res, _What

T = TypeVar("T")
JSON = dict[str, Any]

TAIL_LINES = 2000
LOG_BYTES = 1 << 20
CONCURRENCY = 8
# Conditions every kubelet reports; their "bad" status.
_STANDARD_BAD = {
    "MemoryPressure": "True",
    "DiskPressure": "True",
    "PIDPressure": "True",
    "NetworkUnavailable": "True",
}
_UNREACHABLE = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
_RESTARTING = frozenset({"Restarting", "Aborting", "Aborted", "Terminating"})


class LiveError(TrainmedicError):
    """What the CLI prints when the cluster cannot be asked: a message in both languages."""

    def __init__(self, text: I18nText) -> None:
        super().__init__(text.en)
        self.text = text


def no_kubeconfig(detail: str) -> LiveError:
    return LiveError(
        I18nText(
            en=f"no Kubernetes configuration: {detail} (set KUBECONFIG, pass --kubeconfig FILE, or run in a pod)",
            zh=f"未找到 Kubernetes 配置：{detail}（请设置 KUBECONFIG、使用 --kubeconfig FILE，或在 Pod 中运行）",
        )
    )


def forbidden(err: KubeForbidden) -> LiveError:
    need = err.need or "?"
    scope = err.scope or "?"
    return LiveError(
        I18nText(
            en=f"forbidden: the current kubeconfig user lacks the RBAC permission {need} ({scope}); "
            "ask for it (read only: get, list) and retry",
            zh=f"权限不足：当前 kubeconfig 用户缺少 RBAC 权限 {need}（{scope}）；请申请该权限（只读：get、list）后重试",
        )
    )


def kube_failed(err: KubeError) -> LiveError:
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    return LiveError(I18nText(en=f"the Kubernetes API failed: {first}", zh=f"Kubernetes API 请求失败：{first}"))


def api_client(kubeconfig: str | None, context: str | None = None) -> Any:
    """An ApiClient from `kubeconfig` (else KUBECONFIG / ~/.kube/config, else the in-cluster service
    account), with the kubeconfig's TLS settings, certificates, tokens and exec plugins."""
    from kubernetes import client
    from kubernetes import config as kube_config

    config: Any = kube_config  # the client's loaders are untyped
    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        if kubeconfig or context:
            raise no_kubeconfig(f"{kubeconfig or 'kubeconfig'}: {exc}") from exc
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException as exc2:
            raise no_kubeconfig(str(exc)) from exc2
    return client.ApiClient(cfg)


def parse_job(ref: str, namespace: str | None) -> tuple[str, str]:
    """`NAMESPACE/NAME` or `NAME` (in `namespace`, else "default")."""
    ns, sep, name = ref.partition("/")
    if not sep:
        ns, name = namespace or "default", ref
    if not ns or not name or "/" in name:
        raise LiveError(
            I18nText(
                en=f"--job {ref!r}: expected NAMESPACE/NAME or NAME",
                zh=f"--job {ref!r}：应为 NAMESPACE/NAME 或 NAME",
            )
        )
    return ns, name


class _DaemonCalls(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor (asyncio accepts only a ThreadPoolExecutor) running each call in a
    daemon thread of its own (agent.watchers.k8s.DaemonThreadExecutor), which neither the loop's
    shutdown nor the interpreter's exit waits for."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self._calls = DaemonThreadExecutor("trainmedic-live")

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        return self._calls.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=cancel_futures)


class ReadOps(KubeOps):
    """The reads a person's `diagnose --job` and `scan` make with their own kubeconfig (every kind
    of READ_WORKLOADS, pods of a namespace). They live here, not in KubeOps: remediations/kube/
    holds exactly the daemon's calls, which the deploy tests read to prove its RBAC is minimal."""

    async def read_workload(self, res: _Res, namespace: str, name: str) -> JSON | None:
        """A workload of any kind in READ_WORKLOADS (MPIJob too), or None when absent or its CRD is not
        installed."""
        _check_names(namespace=namespace, name=name)
        what = _What("get", res, namespace, name)
        if res is JOBS:
            return await self._get(what, self.batch.read_namespaced_job, name, namespace)
        return await self._get(
            what, self.custom.get_namespaced_custom_object, res.group, res.version, namespace, res.plural, name
        )

    async def list_workloads(self, res: _Res, namespace: str | None) -> list[JSON]:
        """Every workload of a kind in a namespace (None: all namespaces). KubeNotFound: the CRD is not
        installed."""
        if namespace:
            _check_names(namespace=namespace)
        what = _What("list", res, namespace)
        if res is JOBS:
            if namespace:
                return await self._list(what, self.batch.list_namespaced_job, namespace)
            return await self._list(what, self.batch.list_job_for_all_namespaces)
        if namespace:
            return await self._list(
                what, self.custom.list_namespaced_custom_object, res.group, res.version, namespace, res.plural
            )
        return await self._list(what, self.custom.list_cluster_custom_object, res.group, res.version, res.plural)

    async def list_pods(self, namespace: str) -> list[JSON]:
        """Every pod of a namespace."""
        _check_names(namespace=namespace)
        return await self._list(_What("list", PODS, namespace), self.core.list_namespaced_pod, namespace)

    async def list_all_pods(self, namespace: str | None) -> list[JSON]:
        """Every pod of a namespace, or of every namespace (None)."""
        if namespace:
            return await self.list_pods(namespace)
        return await self._list(_What("list", PODS, None), self.core.list_pod_for_all_namespaces)
