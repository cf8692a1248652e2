"""The commands other than `diagnose` and `scan`: `run`, `rules`, `incidents` and `approve`,
`report`, `checkpoints`, `release-node`, `demo` and `config`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmedic import __version__
from trainmedic.agent.cli.parser import EXIT_OK, EXIT_PROBLEMS, EXIT_UNUSABLE, _out, _print_rule_problems, terminal_safe
from trainmedic.errors import RuleLoadError

if TYPE_CHECKING:
    from trainmedic.agent.config import Role, Settings


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
