"""The exit codes and the argument parser of the `trainmedic` command line, and the output helpers
the commands share.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from trainmedic import __version__
from trainmedic.errors import RuleLoadError

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


def _print_rule_problems(exc: RuleLoadError) -> None:
    for p in exc.problems:
        print(p, file=sys.stderr)


# C0 controls but tab and newline, DEL, and the C1 controls (U+0080-U+009F: a terminal reads U+009B
# as CSI, the start of an escape sequence): log text must not drive the reader's terminal.
_TERMINAL_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """`text` without the control characters a terminal would act on."""
    return _TERMINAL_UNSAFE.sub("", text)


def _out(text: str) -> None:
    """One line to stdout, without the control characters stored text may carry (log lines, names)."""
    print(terminal_safe(text))
