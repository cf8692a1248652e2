"""Start an Apache Kafka broker (KRaft) on free loopback ports, for tests.

The broker is the one production runs (docker-compose.yml's `apache/kafka` version), its jars taken
from Maven Central by `make kafka` (tests/kafka/pom.xml) into
`${XDG_CACHE_HOME:-~/.cache}/trainmedic/kafka-<version>/lib`, or $TRAINMEDIC_KAFKA_LIB. One JVM
plays broker and controller (`process.roles=broker,controller`), like the compose file. Its log
directory is formatted once with a random cluster id and kept across `kill()` / `start()`, so a
test can crash the broker and bring it back with its topics, records and group offsets.

Plain Python, no pytest (`sys.path` must contain the `tests` folder, so the module is
`servers.kafka`), the same shape as `servers.tansu.TansuBroker`:

    with KafkaBroker() as broker:
        bus = KafkaBus(broker.bootstrap)
        ...
        broker.restart()  # kill -9 and start again on the same ports and log directory
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import types
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

from servers.tansu import free_port

log = logging.getLogger("trainmedic.tests.kafka")

LIB_ENV = "TRAINMEDIC_KAFKA_LIB"
POM = Path(__file__).resolve().parents[1] / "kafka" / "pom.xml"

# Java 17 on a small shared machine: a modest heap, one GC thread, C1 only (the broker lives for
# seconds, so a fast start beats peak throughput).
JVM_OPTS = ["-Xmx512m", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]

LOG4J = """\
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
log4j.logger.kafka.Kafka=INFO
log4j.logger.kafka.server.BrokerLifecycleManager=INFO
log4j.logger.kafka.server.BrokerServer=INFO
"""


def class_archive(java: Path, lib: Path) -> Path:
    """Where the broker's class-data archive (AppCDS) for this JVM and these jars lives.

    Loading Kafka's and Scala's classes is most of a start's CPU: with the archive a start takes
    about half the time. The first broker stopped cleanly writes it (-XX:ArchiveClassesAtExit);
    later ones map it. A JVM that finds it unusable starts without it."""
    real = java.resolve()
    st = real.stat()
    tag = hashlib.sha256(f"{real}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return lib.parent / f"classes-{tag}.jsa"


class KafkaBrokerError(RuntimeError):
    """The broker could not be started (no java, jars missing, did not come up in time, exited)."""


class _PortTaken(KafkaBrokerError):
    """The broker exited because one of its ports was in use."""


def kafka_version() -> str:
    """The Kafka version tests/kafka/pom.xml pins (the one docker-compose.yml runs)."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ET.parse(POM).getroot().find("m:properties/m:kafka.version", ns)
    if node is None or not node.text:
        raise KafkaBrokerError(f"no kafka.version in {POM}")
    return node.text.strip()


def kafka_lib() -> Path | None:
    """The folder of the broker's jars: $TRAINMEDIC_KAFKA_LIB or `make kafka`'s cache; None if absent."""
    override = os.environ.get(LIB_ENV)
    if override:
        lib = Path(override)
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        lib = cache / "trainmedic" / f"kafka-{kafka_version()}" / "lib"
    return lib if any(lib.glob("kafka_2.13-*.jar")) else None


def java_binary() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return Path(home) / "bin" / "java"
    found = shutil.which("java")
    return Path(found) if found else None


def missing() -> str | None:
    """Why the broker cannot run here (for a skip or a CI failure), or None when it can."""
    if java_binary() is None:
        return "java is not installed (Debian: openjdk-17-jre-headless; `make kafka` installs it)"
    if kafka_lib() is None:
        return f"the Apache Kafka {kafka_version()} jars are not built: run `make kafka` (or set ${LIB_ENV})"
    return None


def brokers_registered(host: str, port: int, timeout: float = 1.0) -> int:
    """How many brokers a Metadata (v1, no topics) request lists; 0 when the port does not answer.

    A KRaft broker opens its listener only once the controller has unfenced it, so one listed
    broker means it takes produce, fetch and group requests."""
    client_id = b"trainmedic-probe"
    body = struct.pack(">hhih", 3, 1, 0x7A12, len(client_id)) + client_id + struct.pack(">i", 0)
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack(">i", len(body)) + body)
            head = b""
            while len(head) < 12:
                chunk = s.recv(12 - len(head))
                if not chunk:
                    return 0
                head += chunk
    except OSError:
        return 0
    _size, correlation, count = struct.unpack(">iii", head)
    return count if correlation == 0x7A12 else 0


def _cluster_id() -> str:
    """A random KRaft cluster id: a UUID as unpadded base64url, like `kafka-storage random-uuid`,
    which (Kafka's Uuid.randomUuid) draws again while the text starts with `-`: one id in 64 would,
    and `kafka-storage format -t <id>` then reads it as an option."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class KafkaBroker:
    """One Apache Kafka process, broker and controller, on 127.0.0.1:`port` (controller on another port).

    `kill()` is a crash (SIGKILL); `stop()` a clean shutdown (SIGTERM, then SIGKILL after
    `stop_timeout`). Either way the log directory stays until `close()`, and `start()` brings the
    broker back on the same ports with what it had stored.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        lib: Path | None = None,
        java: Path | None = None,
        work_dir: Path | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        properties: dict[str, str] | None = None,
    ) -> None:
        # Ports picked here may be taken by another process before the JVM binds them (seconds
        # later): the first start then retries with others. A port given by the caller is kept.
        self._fixed_port = port is not None
        self.port = port or free_port()
        self.controller_port = self._other_port()
        self.lib = lib or kafka_lib()
        self.java = java or java_binary()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if work_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="kafka-")
            work_dir = Path(self._tmp.name)
        self.work_dir = work_dir
        self.data_dir = work_dir / "data"
        self.log_path = work_dir / "kafka.log"
        self.config_path = work_dir / "server.properties"
        self.extra = dict(properties or {})
        self.cluster_id = _cluster_id()
        self._formatted = False
        self._dumping: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.start_seconds: list[float] = []

    def _other_port(self) -> int:
        p = free_port()
        while p == self.port:
            p = free_port()
        return p

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def properties(self) -> dict[str, str]:
        """server.properties: one KRaft node, replication factors of 1, quick group formation."""
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            # What the bus does not create itself (it creates its topics with its partition count).
            "auto.create.topics.enable": "true",
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            # A group forms at once, and tests may use session timeouts below the default 6 s floor.
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
            # After a crash the controller (the same process) keeps the dead incarnation's session
            # and refuses the new registration until it expires: 9 s by default, 2 s here.
            "broker.session.timeout.ms": "2000",
            "broker.heartbeat.interval.ms": "500",
            # A single voter restarting waits an election timeout before it elects itself.
            "controller.quorum.election.timeout.ms": "300",
            "controller.quorum.election.backoff.max.ms": "300",
            # A small machine: few threads.
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "log.cleaner.threads": "1",
        }
        props.update(self.extra)
        return props

    def _write_config(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        (self.work_dir / "log4j.properties").write_text(LOG4J)

    def _cmd(self, main: str, *args: str, heap: str | None = None) -> list[str]:
        assert self.java is not None and self.lib is not None
        opts = [o for o in JVM_OPTS if not (heap and o.startswith("-Xmx"))] + ([heap] if heap else [])
        if main == "kafka.Kafka":
            opts.append(self._archive_option())
        return [
            str(self.java),
            *opts,
            f"-Dlog4j.configuration=file:{self.work_dir / 'log4j.properties'}",
            "-cp",
            f"{self.lib}/*",
            main,
            *args,
        ]

    def _archive_option(self) -> str:
        assert self.java is not None and self.lib is not None
        archive = class_archive(self.java, self.lib)
        if archive.is_file():
            return f"-XX:SharedArchiveFile={archive}"
        # Written at a clean exit under a name of its own, then moved into place (see stop()).
        self._dumping = archive.with_name(f"{archive.stem}.{os.getpid()}.{id(self)}.tmp")
        return f"-XX:ArchiveClassesAtExit={self._dumping}"

    def _format(self) -> None:
        """Format the log directory for a fresh cluster (kafka-storage.sh format)."""
        cmd = self._cmd(
            "kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(self.config_path), heap="-Xmx128m"
        )
        with open(self.log_path, "ab") as out:
            out.write(f"=== format: {' '.join(cmd)}\n".encode())
            out.flush()
            done = subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=60, check=False
            )
        if done.returncode != 0:
            raise KafkaBrokerError(f"formatting {self.data_dir} failed ({done.returncode}): {self.log_tail()}")
        self._formatted = True

    def start(self) -> None:
        if self.running:
            return
        if self.java is None:
            raise KafkaBrokerError("java is not installed")
        if self.lib is None:
            raise KafkaBrokerError(f"the Apache Kafka jars are not built: run `make kafka` (or set ${LIB_ENV})")
        for attempt in range(1, 4):
            try:
                self._start()
                return
            except _PortTaken:
                if self.start_seconds or attempt == 3:  # clients know these ports: keep them
                    raise
                log.warning("a port of kafka on %s was taken meanwhile; trying other ports", self.bootstrap)
                if not self._fixed_port:
                    self.port = free_port()
                self.controller_port = self._other_port()

    def _start(self) -> None:
        began = time.monotonic()
        self._write_config()
        if not self._formatted:
            self._format()
        cmd = self._cmd("kafka.Kafka", str(self.config_path))
        with open(self.log_path, "ab") as out:
            mark = out.tell()
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            out.write(f"\n=== start {self.starts + 1} at {stamp}: {' '.join(cmd)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.starts += 1
        deadline = began + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code, self._proc = self._proc.returncode, None
                if b"Address already in use" in self.log_path.read_bytes()[mark:]:
                    raise _PortTaken(f"kafka could not bind its ports: {self.log_tail()}")
                raise KafkaBrokerError(f"kafka exited with {code}: {self.log_tail()}")
            if brokers_registered("127.0.0.1", self.port, timeout=0.5):
                self.start_seconds.append(time.monotonic() - began)
                log.info("Apache Kafka up on %s in %.1fs", self.bootstrap, self.start_seconds[-1])
                return
            time.sleep(0.05)
        self.kill()
        raise KafkaBrokerError(
            f"kafka did not answer on {self.bootstrap} within {self.start_timeout}s: {self.log_tail()}"
        )

    def _end(self, sig: signal.Signals, wait: float) -> bool:
        """Signal the broker and wait; True when it exited of itself (not killed after `wait`)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return False
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            log.warning("kafka pid %s ignored %s for %.0fs; killing it", proc.pid, sig.name, wait)
            proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("kafka pid %s did not exit after SIGKILL", proc.pid)
            return False
        return proc.returncode != -signal.SIGKILL

    def kill(self) -> None:
        """Crash the broker (SIGKILL: no clean shutdown). The log directory stays."""
        self._end(signal.SIGKILL, 10)

    def stop(self) -> None:
        """Shut the broker down cleanly (SIGTERM), SIGKILL if it takes longer than `stop_timeout`."""
        dumped, self._dumping = self._dumping, None
        clean = self._end(signal.SIGTERM, self.stop_timeout + (30 if dumped else 0))
        if dumped is not None and self.java is not None and self.lib is not None:
            if clean and dumped.is_file() and dumped.stat().st_size:
                os.replace(dumped, class_archive(self.java, self.lib))
            else:
                dumped.unlink(missing_ok=True)

    def restart(self) -> None:
        """Crash and start again on the same ports, with the same log directory."""
        self.kill()
        self.start()

    def close(self) -> None:
        """Stop the broker and delete its log directory."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> KafkaBroker:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.close()
