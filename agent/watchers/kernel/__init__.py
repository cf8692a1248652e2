"""The node's kernel messages (NVIDIA Xid, OOM killer, PCIe and ECC reports) as `KernelBatch`
events on `trainmedic.kernel`, from whichever place the node keeps them:

* `KmsgSource`: /dev/kmsg, the kernel's own ring buffer. One record per read():
  `<prio>,<seq>,<usec since boot>,<flags>[,...];<message>` followed by ` KEY=value` lines
  (SUBSYSTEM, DEVICE) that belong to it; non-printable bytes of the message come escaped as `\\xNN`.
  A reader that falls behind the ring gets EPIPE once and continues at the oldest record: the gap in
  sequence numbers is logged with its size and counted. It starts at the end of the ring, or after a
  remembered sequence number of the same boot. Reads block, so they run in a dedicated thread.
* `KernelFileSource`: a syslog file (/var/log/kern.log, /var/log/messages), followed by inode
  across rotation and truncation with the tailer's helper (agent/watchers/follow.py).
* `JournaldSource`: `journalctl -k -f -o json` as a subprocess, resumed with `--after-cursor`,
  restarted with backoff when it exits.

What is published is the message text as the kernel wrote it, without a syslog prefix for kmsg and
journald (`NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`), so the shipped
rules (rules/nvidia_xid.yaml, rules/host_oom.yaml) match it. A message of several lines (the
driver's "fallen off the bus" report) becomes its first line followed by indented continuation
lines, which is how dmesg prints it and how the rules' `continuation` joins it back.

Fan-out: kernel messages concern every job on the node, and events are partitioned by job, so one
batch is published once per job with pods here (`JobIndex.jobs_on_node`), as copies of one event
with the same `id` (consumers de-duplicate by id), or once keyed by the node when no job runs here.

The parts: `publish` (what the sources share: the line limits, `KernelSourceUnavailable`, the boot
time and id, `_Publisher`, which batches lines into bus events, and `_KernelSource`, the telemetry and
publisher every source holds), `kmsg` (`KmsgSource`: /dev/kmsg
records), `file` (`KernelFileSource`: a kernel log file followed), `journald` (`JournaldSource`:
`journalctl -k -f`). This package re-exports what the rest of trainmedic and its tests import.
"""

from __future__ import annotations

import logging

from trainmedic.agent.watchers.kernel.file import KernelFileSource
from trainmedic.agent.watchers.kernel.journald import JournaldSource, parse_journal_entry
from trainmedic.agent.watchers.kernel.kmsg import KmsgParser, KmsgSource, parse_kmsg_record
from trainmedic.agent.watchers.kernel.publish import KernelSourceUnavailable, record_lines

log = logging.getLogger("trainmedic.watchers.kernel")


__all__ = [
    "JournaldSource",
    "KernelFileSource",
    "KernelSourceUnavailable",
    "KmsgParser",
    "KmsgSource",
    "parse_journal_entry",
    "parse_kmsg_record",
    "record_lines",
]
