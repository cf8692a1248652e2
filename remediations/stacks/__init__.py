"""Thread stacks of a hung job, taken inside its pods before anything kills them.

A hang's diagnosis says *that* the ranks stopped (a collective timed out, no step for minutes), not
*where*. The Python stacks of the training processes say where: in which collective, which data
loader, which lock. They exist only while the processes live, so the scene takes them first.

Two ways, tried in order in each pod, through the Kubernetes exec API:

1. py-spy (`py-spy dump --pid N`), which reads a process's stacks from outside without stopping
   it: pid 1 first, then every Python process of the container (found through /proc by a small
   POSIX shell loop, `PROCESS_LIST_SCRIPT`).
2. The framework's own dump: a training script that called `faulthandler.register(signal.SIGUSR1)`
   prints every thread's stack to stderr when it receives SIGUSR1; the text is read back from the
   container's log. SIGUSR1 is only sent to processes whose /proc/<pid>/status shows a handler for
   it (SigCgt): for any other process the default action of SIGUSR1 is to terminate it, and taking
   evidence must not kill the job.

Any of it may be impossible: no shell in the image, no py-spy, exec forbidden by RBAC (403), the
container gone. The dump records which method worked, or why none did; it never raises.

Exec speaks the API server's websocket protocol (GET .../pods/<pod>/exec?command=...&stdout=true
&stderr=true, subprotocol v4.channel.k8s.io): every binary frame starts with its channel (1 stdout,
2 stderr, 3 the final Status as JSON: "Success", or "Failure" whose details.causes entry with
reason ExitCode holds the exit code; a Failure without one is the runtime refusing to start the
command). The URL and the credentials come from the official client's generated method, run on a
private ApiClient that shares the configuration (`kubernetes.stream.stream` swaps `call_api` on the
client it is given for the whole call, which races with other threads using that client); the
websocket itself is websocket-client's (the official client's own dependency), opened with a
connect timeout and read frame by frame in a thread, so both the time and the bytes are bounded.

The parts: `podexec` (a command run in a container over the API server's exec, its output and exit
status), `dump` (the stack dump of a pod's Python processes: the methods, their settings and results).
This package re-exports every public name.
"""

from __future__ import annotations

from trainmedic.remediations.stacks.dump import (
    PROCESS_LIST_SCRIPT,
    PythonProcess,
    StackDump,
    StackMethod,
    StackSettings,
    StackSource,
    dump_stacks,
    faulthandler_blocks,
    parse_process_list,
)
from trainmedic.remediations.stacks.podexec import ExecResult, exec_in_pod

__all__ = [
    "PROCESS_LIST_SCRIPT",
    "ExecResult",
    "PythonProcess",
    "StackDump",
    "StackMethod",
    "StackSettings",
    "StackSource",
    "dump_stacks",
    "exec_in_pod",
    "faulthandler_blocks",
    "parse_process_list",
]
