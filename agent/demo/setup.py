"""What the demo sets up before a fault: the emulated nodes, the training job's body (batch/v1 Job or
Volcano Job), the demo's policy and the agent's settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trainmedic.agent.config import Settings
from trainmedic.agent.demo.emulator import Cluster
from trainmedic.agent.demo.faults import Scenario
from trainmedic.agent.demo.stage import (
    BACKOFF,
    DEMO_METRICS_URL,
    GPU_NODES,
    METRICS_INTERVAL_S,
    MOUNT,
    NAMESPACE,
    NPU_NODES,
    QUIET_FLOOR_S,
    TICK_S,
    WINDOW_S,
)
from trainmedic.agent.demo.training import JobProfile

# -- the cluster, the workloads, the agent's settings -----------------------------------------------------


async def add_nodes(cluster: Cluster) -> None:
    """Nodes as the device plugins and feature discovery label them."""
    for n in GPU_NODES:
        await cluster.add_node(
            n,
            gpus=8,
            labels={
                "node.kubernetes.io/instance-type": "h100x8",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8",
            },
        )
    for n in NPU_NODES:
        await cluster.add_node(
            n,
            ascend=8,
            labels={
                "node.kubernetes.io/instance-type": "atlas-800t-a2",
                "accelerator": "huawei-Ascend910",
                "accelerator-type": "module-910b-8",
            },
        )


def _annotations(profile: JobProfile) -> dict[str, str]:
    args = "--resume_from_checkpoint {checkpoint}" if profile.framework == "hf" else "--ckpt-step {step}"
    return {"trainmedic.io/checkpoint-dir": profile.checkpoint_dir, "trainmedic.io/resume-args": args}


def _volume() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return (
        [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt-shared"}}],
        [{"name": "ckpt", "mountPath": MOUNT}],
    )


def job_body(cluster: Cluster, sc: Scenario) -> dict[str, Any]:
    """An Indexed batch/v1 Job, 2 pods x 8 GPUs, LLaMA-Factory under torchrun."""
    volumes, mounts = _volume()
    container = {
        "name": "trainer",
        "image": "registry.example.com/llamafactory:0.9.1-cu124",
        "command": ["torchrun", "--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d", "src/train.py"],
        "args": [f"examples/train_full/{sc.job}.yaml"],
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
        "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}},
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": cluster._meta(sc.job, NAMESPACE, annotations=_annotations(sc.profile)),
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": sc.job}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def volcano_body(cluster: Cluster, sc: Scenario) -> dict[str, Any]:
    """A Volcano Job (master + worker, 8 NPUs each, gang-scheduled), MindSpeed-LLM under torchrun."""
    volumes, mounts = _volume()

    def template() -> dict[str, Any]:
        return {
            "spec": {
                "restartPolicy": "OnFailure",
                "nodeSelector": {"accelerator": "huawei-Ascend910"},
                "containers": [
                    {
                        "name": "mindspeed",
                        "image": "registry.example.com/mindspeed-llm:2.0.0-a2",
                        "command": ["torchrun", "--nnodes=2", "--nproc-per-node=8", "pretrain_gpt.py"],
                        "args": ["--tensor-model-parallel-size", "8", "--load", sc.profile.checkpoint_dir],
                        "resources": {
                            "limits": {"huawei.com/Ascend910": "8"},
                            "requests": {"huawei.com/Ascend910": "8"},
                        },
                        "volumeMounts": mounts,
                    }
                ],
                "volumes": volumes,
            }
        }

    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": cluster._meta(sc.job, NAMESPACE, annotations=_annotations(sc.profile)),
        "spec": {
            "minAvailable": 2,
            "schedulerName": "volcano",
            "queue": "default",
            "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=23456"]},
            "tasks": [
                {"name": "master", "replicas": 1, "template": template()},
                {"name": "worker", "replicas": 1, "template": template()},
            ],
        },
    }


def demo_policy(path: Path) -> Path:
    """The shipped policy in enforce mode, with a 0.2 s backoff between restarts instead of 1 min."""
    from trainmedic.remediations.policy import POLICY_FILE, load_policy

    data = yaml.safe_load(POLICY_FILE.read_text(encoding="utf-8"))
    data["mode"] = "enforce"
    data["budgets"]["backoff"] = {"base": BACKOFF, "factor": 2, "max": "5s"}
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    load_policy(path)  # refuses a broken file with every problem listed
    return path


def demo_settings(
    workdir: Path, *, receiver_url: str | None, secret: str | None, hang_floor_s: float = QUIET_FLOOR_S
) -> tuple[Settings, str | None]:
    """The agent's settings for one fault, and why webhooks are off (None: they are on)."""
    data: dict[str, Any] = {
        "node_name": "trainmedic-demo",
        "log_format": "text",
        "log_level": "WARNING",
        # Container logs come through the API (no /var/log/pods here); kernel lines from the nodes'
        # kern.log files, each followed by its node agent; device metrics from the nodes' simulated
        # exporters through the metrics watcher (agent/demo/metrics.py); no NVML.
        "kubernetes": {"follow_pod_logs": True},
        "logs": {"enabled": False},
        "kernel": {"source": "off"},
        "metrics": {"nvml": False, "prometheus_url": DEMO_METRICS_URL, "interval_s": METRICS_INTERVAL_S},
        "detect": {"window_s": WINDOW_S, "hang_floor_s": hang_floor_s, "tick_s": TICK_S},
        "remediate": {
            "mode": "enforce",
            "policy": str(demo_policy(workdir / "policy.yaml")),
            "store": str(workdir / "trainmedic.db"),
            "scene_dir": str(workdir / "scenes"),
            "checkpoint_path_map": {MOUNT: str(workdir / "shared-volume")},
            "wait_gone_s": 10,
            "log_lines": 2000,
            # The demo's minutes: the last two before the fault, a sample every two seconds.
            "metrics_window_s": 120,
            "metrics_step_s": 2,
        },
    }
    fields = Settings.model_fields
    if "api" in fields:
        data["api"] = {"enabled": False}
    why_off: str | None = None
    if "notify" not in fields:
        why_off = "no notify settings"
    elif receiver_url is None:
        why_off = "no receiver"
    else:
        sink: dict[str, Any] = {"kind": "cloudevents", "name": "demo-receiver", "url": receiver_url}
        if secret is not None:
            sink["secret"] = secret
        data["notify"] = {"sinks": [sink], "source": "trainmedic-demo", "retry_initial_s": 0.2, "retry_max_s": 2}
    try:
        return Settings.model_validate(data), why_off
    except ValueError as e:
        if "notify" not in data:
            raise
        data.pop("notify")
        return Settings.model_validate(data), f"notify settings refused: {str(e).splitlines()[0]}"
