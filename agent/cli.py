"""`trainmedic` command line.

    trainmedic diagnose (--logs PATH [PATH ...] | --scene DIR | --job [NS/]NAME [--save DIR])
                        [--format text|json|markdown] [--lang en|zh]
    trainmedic scan [-n NS | -A] [--format text|json] [--lang en|zh]
    trainmedic rules lint|test|list [--rules DIR ...]
    trainmedic run [--config FILE] [--role node|cluster|brain|all] [--check]
    trainmedic incidents [ID] [--status S] [--format text|json] [--utc] [--store FILE]
    trainmedic approve ID [--reject] [--by NAME] [--comment TEXT] [--store FILE]
    trainmedic report ID [--format md|html] [--lang en|zh] [--store FILE | --config FILE] [--out FILE]
    trainmedic release-node NODE [--incident ID] [--kubeconfig FILE]
    trainmedic demo [--fault xid|oom|hccl|hang|node-lost|app-error|all] [--cluster emulator|real] [--json]
                    [--lang en|zh] [--workdir DIR]
    trainmedic config reference | show [--config FILE]
    trainmedic version | --version

Exit codes: 0 done (whether or not a fault was found); 1 rule problems (`rules lint/test`) or a failed
`run --check`;
2 input or usage that cannot be used, with a one-line reason on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmedic import __version__
from trainmedic.errors import InputError, RuleLoadError

if TYPE_CHECKING:
    from trainmedic.agent.config import Role, Settings
    from trainmedic.agent.live import JobScene
    from trainmedic.detectors.engine import Engine
    from trainmedic.models import Diagnosis

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_UNUSABLE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"trainmedic: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_UNUSABLE)


def _default_lang() -> str:
    lang = os.environ.get("TRAINMEDIC_LANG") or os.environ.get("LANG", "")
    return "zh" if lang.lower().startswith("zh") else "en"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainmedic", description="Fault diagnosis for AI training jobs.")
    parser.add_argument("--version", action="version", version=f"trainmedic {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def rules_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--rules",
            action="append",
            type=Path,
            default=[],
            metavar="DIR",
            help="extra rule directory or file (repeatable), on top of the shipped rules",
        )

    def live_options(p: argparse.ArgumentParser, ns_group: Any = None) -> None:
        (ns_group or p).add_argument(
            "-n", "--namespace", default=None, help="namespace (default: the kubeconfig context's, else default)"
        )
        p.add_argument("--kubeconfig", default=None, metavar="FILE", help="default: KUBECONFIG, ~/.kube/config")
        p.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
        p.add_argument(
            "--timeout", type=float, default=120.0, metavar="S", help="give up after S seconds (default 120)"
        )
        p.add_argument(
            "--tail", type=int, default=2000, metavar="LINES", help="last lines of each container log (default 2000)"
        )

    d = sub.add_parser("diagnose", help="classify the logs of a failed job")
    inputs = d.add_mutually_exclusive_group(required=True)
    inputs.add_argument(
        "--logs",
        nargs="+",
        metavar="PATH",
        help="log files, directories (recursive) or - for stdin; .gz is read as well",
    )
    inputs.add_argument(
        "--scene",
        type=Path,
        metavar="DIR",
        help="a scene bundle the agent saved: its container logs (with their pod, rank and node), "
        "kernel lines and events, diagnosed again",
    )
    inputs.add_argument(
        "--job",
        metavar="[NAMESPACE/]NAME",
        help="a job on the current kubeconfig's cluster (PyTorchJob, MPIJob, Volcano Job, Job, or any pod "
        "owner): its pods' current and previous logs, events and nodes, read only",
    )
    d.add_argument(
        "--save",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --job: also write what was read as a scene bundle into DIR (new or empty), the "
        "agent's layout, redacted; `diagnose --scene DIR` gives the same answer",
    )
    d.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    d.add_argument(
        "--lang",
        choices=("en", "zh"),
        default=_default_lang(),
        help="language of summaries and hints (default from TRAINMEDIC_LANG / LANG)",
    )
    d.add_argument(
        "--engine",
        choices=("auto", "fast", "re"),
        default="auto",
        help="matcher: hyperscan fast path, pure re, or auto (fast when installed)",
    )
    rules_option(d)
    live_options(d)

    sc = sub.add_parser("scan", help="list failed or restarting training jobs and unhealthy nodes (read only)")
    where = sc.add_mutually_exclusive_group()
    where.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    sc.add_argument("--format", choices=("text", "json"), default="text")
    sc.add_argument("--lang", choices=("en", "zh"), default=_default_lang(), help="default from TRAINMEDIC_LANG / LANG")
    live_options(sc, where)
    rules_option(sc)

    r = sub.add_parser("rules", help="check and list detection rules")
    rsub = r.add_subparsers(dest="rules_command", required=True, parser_class=_Parser)
    for name, text in (
        ("lint", "validate rule files; every problem with file:line"),
        ("test", "run every embedded example through the engine"),
        ("list", "list loaded rules"),
    ):
        rules_option(rsub.add_parser(name, help=text))

    run = sub.add_parser("run", help="run the agent (one role, or all in one process)")
    run.add_argument("--config", type=Path, default=None, metavar="FILE", help="settings YAML (default: built-ins)")
    run.add_argument(
        "--role",
        choices=("node", "cluster", "brain", "all"),
        default="all",
        help="node: logs, kernel, devices; cluster: Kubernetes, Prometheus; brain: detectors; all: one process",
    )
    run.add_argument(
        "--check",
        action="store_true",
        help="validate the settings, list every source and capability (on, or off and why), reach the "
        "Kafka brokers and the checkpoint mounts, and exit (1 when the agent would be useless)",
    )

    def store_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", type=Path, default=None, metavar="FILE", help="settings YAML (for the store path)")
        p.add_argument("--store", default=None, metavar="FILE", help="incident store (default: remediate.store)")

    inc = sub.add_parser("incidents", help="list incidents, or show one")
    inc.add_argument("incident", nargs="?", default=None, help="an incident id (a unique prefix is enough)")
    inc.add_argument("--status", default=None, help="only incidents with this status (e.g. awaiting_approval)")
    inc.add_argument("--format", choices=("text", "json"), default="text")
    inc.add_argument("--utc", action="store_true", help="times in UTC (default: the local time zone, RFC 3339)")
    store_option(inc)

    ap = sub.add_parser("approve", help="approve (or reject) a remediation plan awaiting approval")
    ap.add_argument("incident", help="the incident id (a unique prefix is enough)")
    ap.add_argument("--reject", action="store_true", help="reject the plan: nothing is changed")
    ap.add_argument("--by", default=os.environ.get("USER") or "cli", help="who decides (recorded)")
    ap.add_argument("--comment", default="", help="why (recorded in the incident's timeline)")
    store_option(ap)

    rep = sub.add_parser("report", help="an incident's report (Markdown or a self-contained HTML page)")
    rep.add_argument("incident", help="the incident id (a unique prefix is enough)")
    rep.add_argument("--format", choices=("md", "html"), default="md")
    rep.add_argument(
        "--lang", choices=("en", "zh"), default=_default_lang(), help="default from TRAINMEDIC_LANG / LANG"
    )
    rep.add_argument("--out", type=Path, default=None, metavar="FILE", help="write here (atomically) instead of stdout")
    rep.add_argument(
        "--templates",
        type=Path,
        default=None,
        metavar="DIR",
        help="your own report.md.j2 / report.html.j2 (rendered sandboxed)",
    )
    store_option(rep)

    rel = sub.add_parser("release-node", help="undo a quarantine: uncordon, remove the taint, label and condition")
    rel.add_argument("node")
    rel.add_argument("--incident", default=None, help="refuse unless the node was quarantined by this incident")
    rel.add_argument("--config", type=Path, default=None, metavar="FILE", help="settings YAML (kubeconfig)")
    rel.add_argument("--kubeconfig", default=None, metavar="FILE", help="kubeconfig (default: settings, then ~/.kube)")

    demo = sub.add_parser("demo", help="watch a training job fail and heal on an emulated cluster (no cluster needed)")
    demo.add_argument(
        "--fault",
        default="all",
        metavar="xid|oom|hccl|hang|node-lost|app-error|all",
        help="the fault to inject (a comma list works too); all: each in turn (default)",
    )
    demo.add_argument(
        "--cluster",
        choices=("emulator", "real"),
        default="emulator",
        help="emulator: the in-process emulated cluster (default, Python only); real: a real control plane"
        " (kube-apiserver, controller-manager, scheduler, etcd, KWOK nodes) that `make cluster` builds"
        " (faults xid, node-lost)",
    )
    demo.add_argument("--json", action="store_true", help="one JSON object per fault on stdout, nothing else")
    demo.add_argument(
        "--lang", choices=("en", "zh"), default=_default_lang(), help="default from TRAINMEDIC_LANG / LANG"
    )
    demo.add_argument(
        "--workdir",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep store, scenes and reports here (default: a temp dir)",
    )
    demo.add_argument("--verbose", action="store_true", help="the agent's own log lines on stderr as well")

    cfg = sub.add_parser("config", help="the settings: their reference, or the effective values of a file")
    csub = cfg.add_subparsers(dest="config_command", required=True, parser_class=_Parser)
    csub.add_parser("reference", help="every setting as Markdown tables (type, default, env variable, meaning)")
    show = csub.add_parser("show", help="the effective settings (file + environment) as YAML, secrets hidden")
    show.add_argument("--config", metavar="FILE", help="settings YAML (default: none, the embedded defaults)")

    ck = sub.add_parser(
        "checkpoints",
        help="the checkpoints under a directory, complete or not (which one a restart would resume from)",
    )
    ck.add_argument("root", metavar="DIR", help="the job's checkpoint root (trainmedic.io/checkpoint-dir)")
    ck.add_argument(
        "--json", action="store_true", help="one JSON document on stdout (what a checkpoint reader pod prints)"
    )
    ck.add_argument("--max-depth", type=int, default=None, metavar="N", help="levels below DIR searched (default 2)")
    ck.add_argument(
        "--max-entries", type=int, default=None, metavar="N", help="directory entries read in all (default 10,000)"
    )

    sub.add_parser("version", help="print the version")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "diagnose":
            return _diagnose(args)
        if args.command == "scan":
            return _scan(args)
        if args.command == "rules":
            return _rules(args)
        if args.command == "run":
            return _run(args)
        if args.command in ("incidents", "approve"):
            return _incidents(args)
        if args.command == "report":
            return _report(args)
        if args.command == "release-node":
            return _release_node(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "config":
            return _config(args)
        if args.command == "checkpoints":
            return _checkpoints(args)
        print(__version__)
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `trainmedic diagnose ... | head`: the reader left; not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _print_rule_problems(exc: RuleLoadError) -> None:
    for p in exc.problems:
        print(p, file=sys.stderr)


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


# C0 controls but tab and newline, DEL, and the C1 controls (U+0080-U+009F: a terminal reads U+009B
# as CSI, the start of an escape sequence): log text must not drive the reader's terminal.
_TERMINAL_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """`text` without the control characters a terminal would act on."""
    return _TERMINAL_UNSAFE.sub("", text)


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


def _run(args: argparse.Namespace) -> int:
    from trainmedic.agent.config import ConfigError, Role, check_role, load_settings

    role = Role(args.role)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        for p in exc.problems:
            print(f"trainmedic: config: {p}", file=sys.stderr)
        return EXIT_UNUSABLE
    problems = check_role(settings, role)
    if problems:
        for p in problems:
            print(f"trainmedic: config: {p}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.check:
        from trainmedic.agent.configcheck import data_file_problems, refusal_lines

        refused = data_file_problems(settings, role)
        if refused:
            for line in refusal_lines(refused):
                print(terminal_safe(line), file=sys.stderr)
            return EXIT_PROBLEMS
        return _run_check(settings, role)
    from trainmedic.agent import run

    return run.main(settings, role)


def _run_check(settings: Settings, role: Role) -> int:
    """`run --check`: the settings are valid; what will be on and off, and whether that is enough."""
    from trainmedic.agent.health import preflight

    checks = preflight(settings, role)
    print(f"trainmedic {__version__}, role {role.value}, bus {settings.bus.kind}")
    for c in checks:
        print(terminal_safe(c.line()))
    failed = [c for c in checks if c.level == "fail"]
    if failed:
        print(
            f"check FAILED: {len(failed)} problem(s) above; the agent would not be useful as configured\n"
            f"检查未通过：上面有 {len(failed)} 个问题；按当前配置代理无法正常工作",
            file=sys.stderr,
        )
        return EXIT_PROBLEMS
    off = sum(c.level == "off" for c in checks)
    print(f"check OK for role {role.value} ({off} off, see above)\n检查通过：角色 {role.value}（{off} 项关闭，见上）")
    return EXIT_OK


def _rules(args: argparse.Namespace) -> int:
    from trainmedic.detectors.loader import load_rules

    cmd = args.rules_command
    try:
        ruleset = load_rules(args.rules, run_examples=(cmd == "test"))
    except RuleLoadError as exc:
        _print_rule_problems(exc)
        n = len([p for p in exc.problems if not p.warning])
        print(f"rules {cmd}: {n} problem(s)", file=sys.stderr)
        return EXIT_PROBLEMS
    for w in ruleset.warnings:
        print(w, file=sys.stderr)
    if cmd == "list":
        for rule in ruleset.rules:
            file, line = ruleset.origins[rule.id]
            print(
                f"{rule.id:40} {rule.status.value:12} {rule.chip.value:9} {rule.fault_class.value:16} "
                f"{Path(file).name}:{line}"
            )
        return EXIT_OK
    n_ex = sum(len(r.examples.match) + len(r.examples.no_match) for r in ruleset.rules)
    if cmd == "test":
        print(f"rules test: {len(ruleset.rules)} rules, {n_ex} examples passed")
    else:
        print(f"rules lint: {len(ruleset.rules)} rules OK ({len(ruleset.warnings)} warning(s))")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())


def _settings_or_exit(config: Path | None) -> Any:
    from trainmedic.agent.config import ConfigError, load_settings

    try:
        return load_settings(config)
    except ConfigError as exc:
        print(f"trainmedic: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_UNUSABLE) from exc


def _store_path(args: argparse.Namespace) -> str | None:
    """The incident store `--store` or the settings name; None (with the reason said) when it is not there."""
    path: str = args.store or _settings_or_exit(args.config).remediate.store
    if path != ":memory:" and not Path(path).is_file():
        print(f"trainmedic: no incident store at {path} (remediate.store)", file=sys.stderr)
        return None
    return path


def _incidents(args: argparse.Namespace) -> int:
    """`trainmedic incidents [ID]` and `trainmedic approve ID [--reject]` over the incident store."""
    from trainmedic.agent.store import IncidentStore, StoreError

    path = _store_path(args)
    if path is None:
        return EXIT_UNUSABLE
    try:
        store = IncidentStore(path)
        if args.command == "approve":
            incident = store.approve(args.incident, by=args.by, approve=not args.reject, comment=args.comment)
            verb = "rejected" if args.reject else "approved"
            _out(f"{incident.id}: {verb} by {args.by}; status {incident.status.value}")
            if not args.reject:
                print("the agent that owns the job carries out the plan at its next pass (within seconds)")
            return EXIT_OK
        if args.incident:
            incident = store.get(args.incident)
            data = dict(incident.as_dict(), timeline=store.timeline(incident.id))
            if args.format == "json":
                json.dump(data, sys.stdout, ensure_ascii=False, indent=2)
                sys.stdout.write("\n")
            else:
                _print_incident(data, utc=args.utc)
            return EXIT_OK
        incidents = store.recent(status=args.status)
    except StoreError as exc:
        print(f"trainmedic: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.format == "json":
        json.dump([i.as_dict() for i in incidents], sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
        return EXIT_OK
    for i in incidents:
        where = f"{i.namespace}/{i.job}" if i.job else i.key
        _out(
            f"{i.id}  {when(i.created, utc=args.utc)}  {i.status.value:<18} {i.fault_class or '-':<16} "
            f"{i.code or '-':<12} {where}  node={i.node or '-'}"
        )
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    """`trainmedic report ID`: the incident's report from the store and its scene bundle."""
    import sqlite3

    from trainmedic.agent.reporting import render_incident, write_text_atomic
    from trainmedic.agent.store import IncidentStore, StoreError
    from trainmedic.reports.report import ReportError

    path = _store_path(args)
    if path is None:
        return EXIT_UNUSABLE
    try:
        store = IncidentStore(path)
        try:
            text = render_incident(store, args.incident, fmt=args.format, lang=args.lang, template_dir=args.templates)
        finally:
            store.close()
    except (StoreError, ReportError, sqlite3.Error) as exc:
        print(f"trainmedic: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return EXIT_OK
    try:
        write_text_atomic(args.out, text)
    except OSError as exc:
        print(f"trainmedic: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    return EXIT_OK


def when(t: float | None, *, utc: bool = False) -> str:
    """An epoch time as RFC 3339 to the second: local time with its offset, or UTC with Z."""
    from trainmedic.timefmt import rfc3339, rfc3339_local

    if t is None:
        return "-"
    return rfc3339(t) if utc else rfc3339_local(t)


def _out(text: str) -> None:
    """One line to stdout, without the control characters stored text may carry (log lines, names)."""
    print(terminal_safe(text))


def _print_incident(data: dict[str, Any], *, utc: bool = False) -> None:
    _out(f"incident {data['id']}  ({data['status']}, mode {data['mode'] or '-'})")
    _out(f"  created: {when(data.get('created'), utc=utc)}   updated: {when(data.get('updated'), utc=utc)}")
    job, fault = f"{data['namespace']}/{data['job']}", f"{data['fault_class']} {data['code']}"
    _out(f"  job: {job}   fault: {fault}  node: {data['node']}")
    if data["scene_dir"]:
        _out(f"  scene: {data['scene_dir']}")
    plan = data.get("plan") or {}
    if plan.get("blocked"):
        blocked = plan["blocked"]
        _out(f"  blocked: {blocked.get('en') if isinstance(blocked, dict) else blocked}")
    for a in data["actions"]:
        result = a.get("result") or {}
        _out(f"  action {a['seq']}: {a['name']:<24} {a['state']:<10} {json.dumps(result, ensure_ascii=False)[:160]}")
    for e in data["timeline"]:
        _out(f"  {when(e['t'], utc=utc)}  {e['kind']}")


def _checkpoints(args: argparse.Namespace) -> int:
    """`trainmedic checkpoints DIR`: every candidate, newest last, and the one a restart would use.
    With --json, the document remediations/checkpoint_reader.py reads back from a reader pod's log."""
    from trainmedic.remediations import checkpoint_reader, checkpoints

    bounds = {k: v for k, v in (("max_depth", args.max_depth), ("max_entries", args.max_entries)) if v is not None}
    found = checkpoints.list_checkpoints(args.root, **bounds)
    if args.json:
        print(checkpoint_reader.render_listing(args.root, found))
        return EXIT_OK
    if not found:
        print(f"{args.root}: no checkpoint (the directory is missing, empty or holds none)")
        return EXIT_OK
    latest = checkpoints.latest_of(found)
    for c in found:
        mark = "*" if latest is not None and c.path == latest.path else " "
        state = "complete" if c.complete else f"incomplete: {c.reason}"
        step = "-" if c.step is None else str(c.step)
        print(f"{mark} {step:>10}  {c.format:<10}  {c.path}  ({state})")
    print("* the checkpoint a restart resumes from" if latest is not None else "no complete checkpoint")
    return EXIT_OK


def _release_node(args: argparse.Namespace) -> int:
    """`trainmedic release-node NODE`: undo exactly what quarantine_node did."""
    import asyncio

    from trainmedic.agent.run import SourceUnavailableError, _kube_api_client
    from trainmedic.remediations.kube import KubeError, KubeOps

    settings = _settings_or_exit(args.config)
    if args.kubeconfig:
        settings.kubernetes.kubeconfig = args.kubeconfig
    try:
        api = _kube_api_client(settings)
    except SourceUnavailableError as exc:
        print(f"trainmedic: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE

    async def release() -> bool:
        ops = KubeOps(api, attempts=3)
        try:
            return await ops.release_node(args.node, incident_id=args.incident)
        finally:
            ops.close()

    try:
        released = asyncio.run(release())
    except KubeError as exc:
        print(f"trainmedic: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    finally:
        api.close()
    print(f"{args.node}: released" if released else f"{args.node}: was not quarantined by trainmedic")
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    """`trainmedic demo`: faults injected into an emulated cluster, detected and healed by the agent."""
    from trainmedic.agent.demo.runner import main as demo_main

    return demo_main(
        args.fault,
        json_lines=args.json,
        lang=args.lang,
        workdir=args.workdir,
        verbose=args.verbose,
        cluster=args.cluster,
    )


def _config(args: argparse.Namespace) -> int:
    if args.config_command == "reference":
        from trainmedic.agent.configref import reference_markdown

        sys.stdout.write(reference_markdown())
        return EXIT_OK
    import yaml

    from trainmedic.agent.config import ConfigError, load_settings

    try:
        settings = load_settings(args.config)
    except ConfigError as e:
        print(f"trainmedic: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    from trainmedic.agent.urlsafe import redact_config

    # mode="json" turns SecretStr into "**********", and URLs lose their credentials (user info, query
    # tokens, hook paths): secrets never reach the terminal.
    shown = redact_config(settings.model_dump(mode="json"))
    sys.stdout.write(yaml.safe_dump(shown, sort_keys=False, allow_unicode=True))
    return EXIT_OK
