"""`trainmedic demo`: a training job fails and heals on one machine, with no cluster.

An emulated Kubernetes cluster (kmock's API server with a stand-in for the scheduler, kubelet and
workload controllers; 3 NVIDIA and 3 Ascend nodes with 8 accelerators each) runs a simulated
training job that logs steps and writes checkpoints; a fault is injected; the real agent (the same
watchers, bus, detectors, responder and notifier as `trainmedic run --role all`) detects it, saves
the scene, quarantines, restarts from the last complete checkpoint on healthy nodes, sends webhooks
to a local receiver, and the report is written.

    runner     the command: every fault in turn, progress lines or JSON lines, the exit code
    scenario   the faults, the agent's settings, the result of each
    training   the cluster's moving parts: controllers, scheduler, training processes, node logs
    logs       the lines the jobs and nodes print
    receiver   the local webhook receiver
    emulator   the API server (kmock) and the kubelet stand-in (also the tests' emulated cluster)
    plane      a real control plane on loopback (what `make cluster` builds; also the tests')
    realplane  `--cluster real`: the xid and node-lost faults on that plane

kmock (and the aiohttp it brings) is needed at run time: the `demo` extra. Nothing is imported
here, so the emulator can be used without loading the rest.
"""
