"""`trainmedic` command line.

    trainmedic diagnose --logs PATH [PATH ...] [--format text|json|markdown] [--lang en|zh]
    trainmedic rules lint|test|list [--rules DIR ...]
    trainmedic run [--config FILE] [--role node|cluster|brain|all] [--check]
    trainmedic version

Exit codes: 0 done (whether or not a fault was found); 1 rule problems (`rules lint/test`);
2 input or usage that cannot be used, with a one-line reason on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from trainmedic import __version__
from trainmedic.errors import InputError, RuleLoadError

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

    d = sub.add_parser("diagnose", help="classify the logs of a failed job")
    d.add_argument(
        "--logs",
        nargs="+",
        required=True,
        metavar="PATH",
        help="log files, directories (recursive) or - for stdin; .gz is read as well",
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
    run.add_argument("--check", action="store_true", help="validate the settings for the role and exit")

    sub.add_parser("version", help="print the version")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "diagnose":
            return _diagnose(args)
        if args.command == "rules":
            return _rules(args)
        if args.command == "run":
            return _run(args)
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
    from detectors.diagnose import diagnose_paths, make_engine
    from reports.render import render

    fast = {"auto": None, "fast": True, "re": False}[args.engine]
    try:
        engine = make_engine(args.rules, fast=fast)
    except RuleLoadError as exc:
        _print_rule_problems(exc)
        print(f"trainmedic: rules cannot be loaded: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    except RuntimeError as exc:
        print(f"trainmedic: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    try:
        diagnosis = diagnose_paths(args.logs, engine)
    except InputError as exc:
        print(f"trainmedic: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.format == "json":
        json.dump(diagnosis.contract_dict(args.lang), sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(diagnosis, args.format, args.lang))
    sys.stdout.flush()
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from agent.config import ConfigError, Role, check_role, load_settings

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
        print(f"config OK for role {role.value}")
        return EXIT_OK
    from agent import run

    return run.main(settings, role)


def _rules(args: argparse.Namespace) -> int:
    from detectors.loader import load_rules

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
