"""Sources of the pipeline: each watches one kind of input and publishes events on the bus.

- `k8s`: pods, core/v1 events, nodes and training workloads (batch/v1 Jobs, Volcano Jobs, Kubeflow
  PyTorchJobs) through the Kubernetes API (list + watch), feeding the shared `JobIndex`;
- `podlogs`: training pods' logs followed through the API (small clusters without the node role);
- `crilog`: container log files under /var/log/pods on this node (node role);
- `kernel`: kernel messages (/dev/kmsg, a kern.log file or journald) on this node;
- `metrics`: accelerator metrics from Prometheus (cluster role);
- `nvml`: NVIDIA device metrics read locally through NVML (node role);
- `alertmanager`: Alertmanager webhook notifications (received by the API) converted to input events.
"""
