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

The parts: `parser` (the exit codes, the argument parser and the output helpers), `diagnose` (`diagnose` and `scan`:
logs, a scene folder or a live job, the diagnosis printed or saved), `commands` (the other commands: `run`,
`rules`, `incidents` and `approve`, `report`, `checkpoints`, `release-node`, `demo`, `config`). `main`
dispatches to them; this package re-exports what the rest of trainmedic and its tests import.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from trainmedic import __version__
from trainmedic.agent.cli.commands import (
    _checkpoints,
    _config,
    _demo,
    _incidents,
    _release_node,
    _report,
    _rules,
    _run,
    when,
)
from trainmedic.agent.cli.diagnose import _diagnose, _scan
from trainmedic.agent.cli.parser import EXIT_OK, build_parser


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


__all__ = [
    "when",
]
