"""`trainmedic diagnose` (logs, a scene folder or a live job) and `trainmedic scan`: the diagnosis
printed, or saved with the job's scene.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmedic.agent.cli.parser import EXIT_OK, EXIT_UNUSABLE, _out, _print_rule_problems, terminal_safe
from trainmedic.errors import InputError, RuleLoadError

if TYPE_CHECKING:
    from trainmedic.agent.live import JobScene
    from trainmedic.detectors.engine import Engine
    from trainmedic.models import Diagnosis


def _diagnose(args: argparse.Namespace) -> int:
    # Only what the chosen input and format need: a fresh `diagnose` starts in a fraction of a second.
    # The engine uses numpy for offsets, never linear algebra: no OpenBLAS thread pool to start.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from trainmedic.detectors.diagnose import diagnose_paths, make_engine

    fast = {"auto": None, "fast": True, "re": False}[args.engine]
    try:
        if args.scene is not None or args.job is not None:
            # A scene's or a live pod's logs were captured by the container runtime: never hard-wrapped
            # (as the brain scans).
            engine = make_engine(args.rules, fast=fast, unwrap=False)
        else:
            engine = make_engine(args.rules, fast=fast)
    except RuleLoadError as exc:
        _print_rule_problems(exc)
        print(f"trainmedic: rules cannot be loaded: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    except RuntimeError as exc:
        print(f"trainmedic: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.save is not None and args.job is None:
        print("trainmedic: --save DIR goes with --job (a live read to keep)", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.job is not None:
        from trainmedic.agent.live import LiveError

        try:
            diagnosis = _diagnose_job(args, engine)
        except LiveError as exc:
            print(f"trainmedic: {exc.text.get(args.lang)}", file=sys.stderr)
            return EXIT_UNUSABLE
        return _print_diagnosis(diagnosis, args)
    unusable: tuple[type[Exception], ...] = (InputError,)
    if args.scene is not None:
        from trainmedic.remediations.scene import SceneError

        unusable = (InputError, SceneError)
    try:
        diagnosis = _diagnose_scene(args.scene, engine) if args.scene is not None else diagnose_paths(args.logs, engine)
    except unusable as exc:
        print(f"trainmedic: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return EXIT_UNUSABLE
    return _print_diagnosis(diagnosis, args)


def _print_diagnosis(diagnosis: Diagnosis, args: argparse.Namespace) -> int:
    if args.format == "json":
        json.dump(diagnosis.contract_dict(args.lang), sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        from trainmedic.reports.render import render

        sys.stdout.write(terminal_safe(render(diagnosis, args.format, args.lang)))
    sys.stdout.flush()
    return EXIT_OK


def _diagnose_scene(scene_dir: Path, engine: Engine) -> Diagnosis:
    """A saved scene bundle through the same core as `--logs`, each text attributed as the brain
    attributed it live: kernel lines to their node, core/v1 events, node, workload and pod statuses
    rendered as the canonical lines the rules match, container logs to their pod, namespace, node
    and rank (agent.jobinputs, which `diagnose --job` shares)."""
    from trainmedic.agent.jobindex import rank_of
    from trainmedic.agent.jobinputs import job_inputs
    from trainmedic.detectors.diagnose import LogInput, diagnose_inputs
    from trainmedic.models import Source
    from trainmedic.remediations.scene import load_scene

    scene = load_scene(scene_dir, verify=True)
    pods = {str((p.get("metadata") or {}).get("name")): p for p in scene.pods()}
    logs = scene.logs()
    kernel = [
        LogInput(
            name=log.rel,
            path=str(log.path),
            source=Source.KERNEL,
            node=log.node,
            first_line=log.first_line,
            last_line=log.last_line,
        )
        for log in logs
        if log.source is Source.KERNEL
    ]
    container_logs = []
    for log in logs:
        if log.source is not Source.CONTAINER_LOG:
            continue
        pod_obj = pods.get(log.pod or "")
        rank = log.rank if log.rank is not None else (rank_of(pod_obj) if pod_obj is not None else None)
        key = (log.pod or "", log.container or "", log.previous)
        container_logs.append(
            (
                key,
                LogInput(
                    name=log.rel,
                    path=str(log.path),
                    source=Source.CONTAINER_LOG,
                    node=log.node,
                    pod=log.pod,
                    namespace=log.namespace,
                    rank=rank,
                ),
            )
        )
    inputs = job_inputs(
        events=scene.events(),
        nodes=scene.nodes(),
        workload=scene.workload(),
        pods=pods.values(),
        logs=container_logs,
        kernel=kernel,
    )
    return diagnose_inputs(inputs, engine)


def _live_namespace(args: argparse.Namespace) -> str | None:
    """-n, else the kubeconfig context's namespace, else None (the caller's default)."""
    if args.namespace:
        return str(args.namespace)
    with contextlib.suppress(Exception):
        from kubernetes import config as kube_config

        loader: Any = kube_config
        _, current = loader.list_kube_config_contexts(config_file=args.kubeconfig)
        if args.context:
            contexts, _ = loader.list_kube_config_contexts(config_file=args.kubeconfig)
            current = next((c for c in contexts if c.get("name") == args.context), current)
        ns = (current or {}).get("context", {}).get("namespace")
        if isinstance(ns, str) and ns:
            return ns
    return None


def _diagnose_job(args: argparse.Namespace, engine: Engine) -> Diagnosis:
    """`diagnose --job`: read the job from the cluster (read only), classify as `--scene` does."""
    import asyncio

    from trainmedic.agent.live import Reader, parse_job, with_ops

    namespace, name = parse_job(args.job, _live_namespace(args))
    if args.save is not None:
        _check_save_dir(args.save)

    async def body(reader: Reader) -> tuple[JobScene, Diagnosis]:
        reader.tail_lines = max(1, args.tail)
        scene = await reader.job(namespace, name)
        logs = sum(1 for t in scene.logs.values() if t)
        counts = (len(scene.pods), logs, len(scene.events), len(scene.nodes))
        if args.lang == "zh":
            read = "已读取 {} 个 Pod、{} 份容器日志、{} 条事件、{} 个节点".format(*counts)
        else:
            read = "read {} pods, {} container logs, {} events, {} nodes".format(*counts)
        print(f"trainmedic: {scene.kind} {namespace}/{name}: {read}", file=sys.stderr)
        for what in scene.skipped:
            skipped = "已跳过（无权限）" if args.lang == "zh" else "skipped (forbidden)"
            print(f"trainmedic: {skipped}: {what}", file=sys.stderr)
        return scene, scene.diagnose(engine)

    scene, diagnosis = asyncio.run(with_ops(args.kubeconfig, args.context, args.timeout, body))
    if args.save is not None:
        _save_live_scene(scene, diagnosis, args.save, args.lang)
    result: Diagnosis = diagnosis
    return result


def _check_save_dir(directory: Path) -> None:
    """`--save DIR` must be new or an empty directory with a usable name: said before the cluster is read."""
    from trainmedic.agent.live import LiveError
    from trainmedic.models import I18nText
    from trainmedic.remediations.scene import valid_bundle_name

    if not valid_bundle_name(directory.absolute().name):
        raise LiveError(
            I18nText(
                en=f"--save {directory}: a bundle directory's name is letters, digits, '.', '_' and '-'",
                zh=f"--save {directory}：现场包目录名只能包含字母、数字、“.”、“_”和“-”",
            )
        )
    if directory.exists() and not (directory.is_dir() and not any(directory.iterdir())):
        raise LiveError(
            I18nText(
                en=f"--save {directory}: exists and is not empty: choose a new directory",
                zh=f"--save {directory}：已存在且不为空，请指定一个新目录",
            )
        )


def _save_live_scene(scene: JobScene, diagnosis: Diagnosis, directory: Path, lang: str) -> None:
    """`diagnose --job --save DIR`: the bundle of what was read (LiveError when it cannot be written)."""
    import asyncio
    import time

    from trainmedic.agent.live import LiveError
    from trainmedic.models import I18nText
    from trainmedic.remediations.scene import SceneError

    try:
        # The read is done: the bundle is written outside the read's deadline.
        result = asyncio.run(scene.save(directory, diagnosis, now=time.time()))
    except (SceneError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LiveError(
            I18nText(
                en=f"--save {directory}: cannot write the scene: {first}",
                zh=f"--save {directory}：无法写入现场包：{first}",
            )
        ) from exc
    files = len(result.manifest.get("files") or [])
    if lang == "zh":
        said = f"现场包已保存到 {result.dir}（{files} 个文件）；重新诊断：trainmedic diagnose --scene {result.dir}"
    else:
        said = (
            f"scene saved to {result.dir} ({files} files); diagnose it again: trainmedic diagnose --scene {result.dir}"
        )
    print(f"trainmedic: {said}", file=sys.stderr)


def _scan(args: argparse.Namespace) -> int:
    """`trainmedic scan`: unhealthy training workloads and nodes on the current kubeconfig's cluster."""
    import asyncio

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from trainmedic.agent.live import LiveError, Reader, scan, with_ops
    from trainmedic.detectors.diagnose import make_engine

    try:
        engine = make_engine(args.rules, unwrap=False)
    except RuleLoadError as exc:
        _print_rule_problems(exc)
        print(f"trainmedic: rules cannot be loaded: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    namespace = None if args.all_namespaces else (_live_namespace(args) or "default")

    async def body(reader: Reader) -> dict[str, Any]:
        reader.tail_lines = max(1, args.tail)
        return await scan(reader, namespace, engine, args.lang)

    try:
        result: dict[str, Any] = asyncio.run(with_ops(args.kubeconfig, args.context, args.timeout, body))
    except LiveError as exc:
        print(f"trainmedic: {exc.text.get(args.lang)}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.format == "json":
        json.dump({"namespace": namespace, **result}, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
        return EXIT_OK
    zh = args.lang == "zh"
    where = ("所有命名空间" if zh else "all namespaces") if namespace is None else namespace
    out = [f"{'训练作业' if zh else 'Training workloads'} ({where}):"]
    if not result["workloads"]:
        out.append("  " + ("无失败或重启中的作业" if zh else "none failed or restarting"))
    for w in result["workloads"]:
        out.append(f"  {w['kind']} {w['namespace']}/{w['name']}  {w['state']}")
        out.append(f"      {w['summary']}")
    out.append(f"{'节点' if zh else 'Nodes'}:")
    if not result["nodes"]:
        out.append("  " + ("无异常节点" if zh else "no node with problems"))
    for n in result["nodes"]:
        out.append(f"  {n['node']}  {n['summary']}")
    for s in result["skipped"]:
        out.append(f"{'已跳过（无权限）' if zh else 'skipped (forbidden)'}: {s}")
    _out(terminal_safe("\n".join(out) + "\n"))
    return EXIT_OK
