#!/usr/bin/env python3
"""Re-create the PyTorch distributed failure-log fixtures under tests/data/pytorch/<scenario>/.

Every scenario is a real run of scripts/train.py under torchrun (gloo backend, CPU, --nnodes 1,
c10d rendezvous on loopback).  What torchrun printed (stdout+stderr together) goes to
<scenario>/torchrun.log; the per-rank copies torchrun wrote with --log-dir/--redirects 3/--tee 3 go to
<scenario>/ranks/<local_rank>/{stdout,stderr}.log; kernel lines that appeared during the run (dmesg)
go to <scenario>/dmesg.log; expected.json says what a correct diagnosis must say.

Needs root for: the memory cgroup (cgroup_oom), tmpfs mounts (disk_full_checkpoint) and the mount
namespace with a 1 MiB /dev/shm (shm_exhausted).

    TORCH_PY=/work/torchenv/bin/python python3 generate.py [scenario ...]
"""
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = os.environ.get("TORCH_PY", sys.executable)
TORCHRUN = [PY, "-m", "torch.distributed.run"]
CGROUP = "/sys/fs/cgroup/memory/trainmedic_oom"
CKPT_MNT = "/mnt/trainmedic_ckpt"


def dmesg_lines():
    try:
        return subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout.splitlines()
    except Exception:
        return None


def wait_for(pred, timeout=120, every=0.2):
    end = time.time() + timeout
    while time.time() < end:
        r = pred()
        if r:
            return r
        time.sleep(every)
    return None


def rank_log_has(logdir, local_rank, text):
    for f in glob.glob(os.path.join(logdir, "*", "attempt_*", str(local_rank), "stdout.log")):
        with open(f, errors="replace") as fh:
            if text in fh.read():
                return True
    return False


def run(name, script_args, expected, nproc=2, port=29500, rdzv_conf=None, endpoint=None, env=None,
        wrap=None, during=None, snapshot_after_silence=None, timeout=180, monitor_interval=None):
    out = os.path.join(HERE, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    logdir = tempfile.mkdtemp(prefix="tm_logs_")
    piddir = tempfile.mkdtemp(prefix="tm_pids_")
    cmd = TORCHRUN + ["--nnodes", "1", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
                      "--rdzv-endpoint", endpoint or f"127.0.0.1:{port}", "--rdzv-id", name,
                      "--max-restarts", "0", "--log-dir", logdir, "--redirects", "3", "--tee", "3"]
    if rdzv_conf:
        cmd += ["--rdzv-conf", rdzv_conf]
    if monitor_interval:
        cmd += ["--monitor-interval", str(monitor_interval)]
    cmd += ["scripts/train.py", "--pid-dir", piddir] + script_args
    if wrap:
        cmd = wrap(cmd)
    e = dict(os.environ, PYTHONUNBUFFERED="1")
    e.pop("TORCHELASTIC_ERROR_FILE", None)
    e.update(env or {})
    before = dmesg_lines()
    t0 = time.time()
    log_path = os.path.join(out, "torchrun.log")
    with open(log_path, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=HERE, stdout=fh, stderr=subprocess.STDOUT, env=e, start_new_session=True)
        ctx = dict(proc=proc, logdir=logdir, piddir=piddir, out=out)
        if during:
            during(ctx)
        if snapshot_after_silence:
            # the run makes no progress: wait until the log has been silent for N seconds,
            # keep the log as it stands then, and only afterwards stop the job.
            last, last_size = time.time(), -1
            while time.time() - last < snapshot_after_silence and time.time() - t0 < timeout:
                size = os.path.getsize(log_path)
                if size != last_size:
                    last, last_size = time.time(), size
                time.sleep(0.5)
            fh.flush()
            shutil.copy(log_path, log_path + ".snap")
            ctx["extra"] = {"snapshot.txt": "torchrun.log and ranks/ were copied at %s, %.0f s after the log last "
                            "grew; the job was still running then.\n" % (time.strftime("%Y-%m-%d %H:%M:%S"),
                                                                          time.time() - last)}
            copy_rank_logs(logdir, out)
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            os.replace(log_path + ".snap", log_path)
        else:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    rc = proc.returncode
    if not snapshot_after_silence:
        copy_rank_logs(logdir, out)
    after = dmesg_lines()
    if before is not None and after is not None:
        new = after[len(before):] if after[:len(before)] == before else [l for l in after if l not in set(before)]
        if new:
            with open(os.path.join(out, "dmesg.log"), "w") as f:
                f.write("\n".join(new) + "\n")
    if ctx.get("extra"):
        for fname, text in ctx["extra"].items():
            with open(os.path.join(out, fname), "w") as f:
                f.write(text)
    scrub(out, {logdir: "<LOG_DIR>", piddir: "<PID_DIR>"})
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(dict(expected, node=None), f, indent=2)
        f.write("\n")
    shutil.rmtree(logdir, ignore_errors=True)
    shutil.rmtree(piddir, ignore_errors=True)
    print(f"{name}: torchrun exit {rc} after {time.time() - t0:.1f}s", flush=True)
    return rc


def scrub(out, repl):
    """The only edit made to recorded output: random temp directories become placeholders."""
    for f in glob.glob(os.path.join(out, "**", "*"), recursive=True):
        if not os.path.isfile(f):
            continue
        with open(f, "rb") as fh:
            data = fh.read()
        new = data
        for k, v in repl.items():
            new = new.replace(k.encode(), v.encode())
        if new != data:
            with open(f, "wb") as fh:
                fh.write(new)


def copy_rank_logs(logdir, out):
    for f in sorted(glob.glob(os.path.join(logdir, "*", "attempt_*", "*", "*"))):
        local_rank = os.path.basename(os.path.dirname(f))
        dst = os.path.join(out, "ranks", local_rank)
        os.makedirs(dst, exist_ok=True)
        shutil.copy(f, os.path.join(dst, os.path.basename(f)))


def exp(fault_class, code, origin_rank, notes):
    return {"fault_class": fault_class, "code": code, "origin_rank": origin_rank, "notes": notes}


# --- helpers used while a run is in flight ---------------------------------------------------

def kill_rank(rank, sig, at_step=3):
    def during(ctx):
        if not wait_for(lambda: rank_log_has(ctx["logdir"], rank, f"step {at_step} ") or ctx["proc"].poll() is not None):
            return
        if ctx["proc"].poll() is not None:
            return
        pid = int(open(os.path.join(ctx["piddir"], f"rank{rank}.pid")).read())
        os.kill(pid, sig)
    return during


def term_torchrun(at_step=3):
    def during(ctx):
        wait_for(lambda: rank_log_has(ctx["logdir"], 0, f"step {at_step} ") or ctx["proc"].poll() is not None)
        if ctx["proc"].poll() is None:
            ctx["proc"].send_signal(signal.SIGTERM)
    return during


def cgroup_events(ctx):
    ctx["proc"].wait(180)
    text = ""
    for f in ("memory.limit_in_bytes", "memory.max_usage_in_bytes", "memory.failcnt", "memory.oom_control"):
        with open(os.path.join(CGROUP, f)) as fh:
            text += f"==> {CGROUP}/{f} <==\n{fh.read()}"
    ctx["extra"] = {"memory_cgroup.txt": text}


# --- scenarios --------------------------------------------------------------------------------

def s_raise_exception():
    run("raise_exception", ["--mode", "keyerror", "--fail-rank", "1", "--fail-step", "3"],
        exp("app_error", "python_exception", 1,
            "rank 1 raises KeyError: 'labels' in its data step at step 3; rank 0 then fails in backward "
            "with gloo 'Connection closed by peer' (a consequence) and torchrun SIGTERMs it; the ChildFailedError "
            "'Root Cause (first observed failure)' block names rank 1, exitcode 1, with the traceback (@record)."), port=29501)


def s_raise_exception_4ranks():
    run("raise_exception_4ranks", ["--mode", "keyerror", "--fail-rank", "2", "--fail-step", "3"],
        exp("app_error", "python_exception", 2,
            "4 ranks; rank 2 raises KeyError: 'labels' at step 3; the other ranks fail or are SIGTERMed by torchrun "
            "as a consequence; the 'Root Cause (first observed failure)' block names rank 2 (local_rank 2)."),
        nproc=4, port=29521)


def s_rank_sigkill():
    run("rank_sigkill", ["--mode", "healthy", "--steps", "60", "--step-sleep", "0.3"],
        exp("process_killed", "sigkill", 1,
            "rank 1 (pid in its 'init_process_group done' line) was sent SIGKILL from outside (os.kill) after step 3; "
            "no OOM record in dmesg. torchrun ran with --monitor-interval 5 (the pre-2.2 default), so rank 0 "
            "fails first with gloo 'Connection closed by peer' and torchrun's 'Root Cause (first observed "
            "failure)' block names rank 0 (exitcode 1); rank 1's 'Signal 9 (SIGKILL) received by PID' is listed "
            "under Failures. The real origin is rank 1: a diagnosis must not take torchrun's root-cause block at "
            "face value."),
        port=29502, during=kill_rank(1, signal.SIGKILL), monitor_interval=5)


def s_rank_sigkill_fast_monitor():
    run("rank_sigkill_fast_monitor", ["--mode", "healthy", "--steps", "60", "--step-sleep", "0.3"],
        exp("process_killed", "sigkill", 1,
            "rank 1 SIGKILLed from outside after step 3 with torchrun's default --monitor-interval (0.1 s): torchrun "
            "notices at once, names local_rank 1 'exitcode -9 ... Signal 9 (SIGKILL) received by PID' as the root "
            "cause and SIGTERMs rank 0; whether rank 0 first prints a gloo 'Connection closed by peer' error depends on "
            "timing (in this recording it did)."),
        port=29519, during=kill_rank(1, signal.SIGKILL))


def s_ddp_debug_detail_segfault():
    run("ddp_debug_detail_segfault", ["--mode", "healthy", "--steps", "60", "--step-sleep", "0.3"],
        exp("app_error", "sigsegv", None,
            "meant as rank_sigkill with TORCH_DISTRIBUTED_DEBUG=DETAIL and TORCH_CPP_LOG_LEVEL=INFO, but with this "
            "torch build both ranks crash by themselves with 'Fatal Python error: Segmentation fault' inside "
            "DistributedDataParallel.__init__ (_ddp_init_helper) right after 'Reducer: using regular allocator', "
            "before step 0, so nobody was killed. Exitcode -11 (SIGSEGV) on both ranks; torchrun names local_rank 0 "
            "as first observed failure but the crash is identical on every rank (no single origin)."),
        port=29518, during=kill_rank(1, signal.SIGKILL), monitor_interval=5,
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_CPP_LOG_LEVEL": "INFO"})


def s_rank_sigkill_debug():
    run("rank_sigkill_debug", ["--mode", "healthy", "--steps", "60", "--step-sleep", "0.3"],
        exp("process_killed", "sigkill", 1,
            "same as rank_sigkill, run with TORCH_DISTRIBUTED_DEBUG=INFO and TORCH_CPP_LOG_LEVEL=INFO "
            "(extra c10d TCPStore/socket lines); rank 1 SIGKILLed from outside after step 3. (DETAIL crashes DDP "
            "init with this build: see ddp_debug_detail_segfault.)"),
        port=29503, during=kill_rank(1, signal.SIGKILL), monitor_interval=5,
        env={"TORCH_DISTRIBUTED_DEBUG": "INFO", "TORCH_CPP_LOG_LEVEL": "INFO"})


def s_rank_sigterm():
    run("rank_sigterm", ["--mode", "healthy", "--steps", "60", "--step-sleep", "0.3"],
        exp("process_killed", "sigterm", None,
            "SIGTERM sent to the torchrun agent (preemption-like) after step 3; the agent forwards SIGTERM to all "
            "workers and exits with SignalException 'got signal: 15'; no rank is at fault."),
        port=29504, during=term_torchrun())


def s_rank_stall():
    run("rank_stall", ["--mode", "stall", "--fail-rank", "1", "--fail-step", "3", "--timeout", "20", "--steps", "20"],
        exp("hang", "collective_timeout", 1,
            "rank 1 stops at step 3 (sleeps forever, prints 'this rank stops here'); rank 0 waits in the DDP "
            "gradient all_reduce until the 20 s gloo timeout ('Timed out waiting 20000ms'), exits 1, and torchrun "
            "then SIGTERMs rank 1. Rank 0 is the one that reported the timeout; the missing rank is 1."),
        port=29505, timeout=240)


def s_cgroup_oom():
    if os.path.isdir(CGROUP):
        os.rmdir(CGROUP)
    os.makedirs(CGROUP)
    with open(os.path.join(CGROUP, "memory.limit_in_bytes"), "w") as f:
        f.write(str(300 * 1024 * 1024))
    try:
        run("cgroup_oom", ["--mode", "oom", "--fail-rank", "1", "--fail-step", "3", "--cgroup", CGROUP],
            exp("host_oom", "oom_killed", 1,
                "rank 1 moves itself into a cgroup-v1 memory cgroup with memory.limit_in_bytes=300M and allocates "
                "64 MiB tensors until the kernel OOM killer kills it (SIGKILL): dmesg.log has the "
                "'Memory cgroup out of memory: Killed process <pid>' record for that pid, memory_cgroup.txt has "
                "oom_kill 1; torchrun itself only says 'Signal 9 (SIGKILL) received by PID'."),
            port=29506, during=cgroup_events)
    finally:
        time.sleep(1)
        try:
            os.rmdir(CGROUP)
        except OSError:
            pass


def s_cpu_alloc_fail():
    run("cpu_alloc_fail", ["--mode", "cpu_alloc", "--fail-rank", "0", "--fail-step", "3"],
        exp("host_oom", "cpu_alloc_failed", 0,
            "rank 0 calls torch.empty(2**45) (128 TiB): 'DefaultCPUAllocator: can't allocate memory: you tried to "
            "allocate 140737488355328 bytes. Error code 12 (Cannot allocate memory)'. The request is absurd, so a "
            "human would also call it a program bug; host memory allocation failure is the class."),
        port=29507)


def s_shm_exhausted():
    def wrap(cmd):
        inner = "mount -t tmpfs -o size=1M tmpfs /dev/shm && exec " + " ".join(cmd)
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", inner]
    run("shm_exhausted", ["--mode", "shm", "--fail-rank", "-1"],
        exp("host_oom", "shm_exhausted", None,
            "the job runs in a mount namespace whose /dev/shm is a 1 MiB tmpfs; DataLoader workers (2 per rank) "
            "return 16 MiB tensors through shared memory, which does not fit. Both ranks fail the same way, so no "
            "single origin rank."),
        port=29508, wrap=wrap)


def s_rendezvous_wrong_addr():
    run("rendezvous_wrong_addr", [],
        exp("comm_init", "rendezvous_connect", None,
            "rdzv endpoint 127.0.0.2:29400 (loopback, nothing listening), is_host=false so the agent joins as a "
            "client; the TCPStore connection is refused/timeouts and torchrun fails with RendezvousConnectionError "
            "before any worker starts."),
        endpoint="127.0.0.2:29400", rdzv_conf="is_host=false,join_timeout=15,read_timeout=15")


def s_port_in_use():
    s = socket.socket()
    s.bind(("127.0.0.1", 29509))
    s.listen()
    try:
        run("port_in_use", [],
            exp("comm_init", "eaddrinuse", None,
                "another process has 127.0.0.1:29509 bound and listening; torchrun (is_host=true) cannot start the "
                "rendezvous TCPStore server there: 'address already in use' -> RendezvousConnectionError before "
                "any worker starts."),
            port=29509, rdzv_conf="is_host=true")
    finally:
        s.close()


def s_segfault():
    run("segfault", ["--mode", "segv", "--fail-rank", "1", "--fail-step", "3"],
        exp("app_error", "sigsegv", 1,
            "rank 1 dereferences NULL (ctypes.string_at(0)) at step 3 and dies with SIGSEGV; torchrun reports "
            "exitcode -11 'Signal 11 (SIGSEGV) received by PID' for local_rank 1."), port=29510)


def s_abort():
    run("abort", ["--mode", "abort", "--fail-rank", "1", "--fail-step", "3"],
        exp("app_error", "sigabrt", 1,
            "rank 1 calls os.abort() at step 3; torchrun reports exitcode -6 'Signal 6 (SIGABRT) received by PID' "
            "for local_rank 1."), port=29511)


def s_disk_full_checkpoint():
    os.makedirs(CKPT_MNT, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", CKPT_MNT], check=True)
    try:
        run("disk_full_checkpoint", ["--mode", "healthy", "--dim", "1024", "--steps", "8", "--ckpt-every", "4",
                                     "--ckpt-dir", CKPT_MNT],
            exp("storage_error", "enospc", 0,
                "rank 0 saves a ~8 MiB checkpoint (torch.save(state, path)) into a 1 MiB tmpfs at " + CKPT_MNT +
                " after step 4. With this torch build the text does NOT say ENOSPC: torch.save fails with "
                "'RuntimeError: basic_ios::clear: iostream error' and then '[enforce fail at inline_container.cc:...] "
                ". unexpected pos ... vs ...' (PyTorchStreamWriter); the only storage hint is the 'saving checkpoint "
                "to /mnt/...' line before it and torch.save/serialization.py in the traceback. Rank 1 then fails in "
                "the barrier (Connection closed by peer)."), port=29512)
    finally:
        subprocess.run(["umount", CKPT_MNT])


def s_disk_full_checkpoint_fileobj():
    os.makedirs(CKPT_MNT, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", CKPT_MNT], check=True)
    try:
        run("disk_full_checkpoint_fileobj", ["--mode", "healthy", "--dim", "1024", "--steps", "8", "--ckpt-every",
                                             "4", "--ckpt-dir", CKPT_MNT, "--ckpt-fileobj"],
            exp("storage_error", "enospc", 0,
                "as disk_full_checkpoint, but rank 0 calls torch.save(state, f) on a file it opened itself "
                "(open(path, 'wb')), into the 1 MiB tmpfs at " + CKPT_MNT + ": here the log has "
                "'OSError: [Errno 28] No space left on device', followed by '[enforce fail at inline_container.cc:...] "
                ". unexpected pos ... vs ...'. Rank 1 then fails in the barrier (Connection closed by peer)."),
            port=29520)
    finally:
        subprocess.run(["umount", CKPT_MNT])


def s_collective_mismatch():
    run("collective_mismatch", ["--mode", "mismatch", "--fail-rank", "-1", "--fail-step", "3", "--timeout", "30"],
        exp("app_error", "collective_mismatch", None,
            "at step 3 rank 0 calls all_reduce on 10 floats and rank 1 on 20 floats (gloo). Gloo detects it: rank 0 "
            "dies with \"terminate called after throwing an instance of 'gloo::EnforceNotMet'\" ... 'Received data "
            "size doesn't match expected size. Is there a distributed collective mismatch in your code?' and "
            "'Fatal Python error: Aborted' (exitcode -6, SIGABRT raised by the program itself); rank 1 gets "
            "'Connection reset by peer'. The bug is the disagreement between ranks, so no single origin rank; "
            "torchrun's root-cause block names rank 0, where it was detected."),
        port=29513, timeout=240)


def s_healthy_tqdm():
    run("healthy_tqdm", ["--mode", "tqdm", "--steps", "40", "--step-sleep", "0.1"],
        exp(None, None, None, "healthy run; rank 0 draws a tqdm bar with the description 'Epoch 1' and a loss "
                              "postfix, carried through torchrun --tee 3 with the [default0]: prefix."), port=29514)


def s_healthy_hf_dicts():
    run("healthy_hf_dicts", ["--mode", "hf", "--steps", "40", "--step-sleep", "0.05"],
        exp(None, None, None, "healthy run; rank 0 prints HF-Trainer-style log dicts {'loss': ..., 'grad_norm': "
                              "..., 'learning_rate': ..., 'epoch': ...} every 5 steps and a final train_runtime dict."),
        port=29515)


def s_healthy_checkpoint():
    d = "/tmp/trainmedic_ckpt"
    os.makedirs(d, exist_ok=True)
    try:
        run("healthy_checkpoint", ["--mode", "healthy", "--steps", "12", "--ckpt-every", "4", "--ckpt-pause", "10",
                                   "--ckpt-dir", d],
            exp(None, None, None, "healthy run; every 4 steps rank 0 pauses 10 s while 'saving checkpoint' (all ranks "
                                  "wait in a barrier, no output), then finishes normally. A 10 s silence after a "
                                  "'saving checkpoint' line is not a hang."), port=29516)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def s_stalled_all_ranks_tqdm():
    run("stalled_all_ranks_tqdm", ["--mode", "stalled_all_tqdm", "--step-sleep", "0.3"],
        exp("hang", "no_progress", None,
            "all ranks stop advancing after 12 steps: the DataLoader worker blocks forever in __getitem__, so both "
            "ranks wait for data; the tqdm bar ('Epoch 1', 12/100) and the timestamped step lines just stop. The log "
            "is the snapshot taken after 45 s of silence, while the job was still running (snapshot.txt has the "
            "wall-clock time of the snapshot; the job was stopped only afterwards and the stop is not part of the "
            "fixture)."),
        port=29517, snapshot_after_silence=45, timeout=240)


SCENARIOS = {k[2:]: v for k, v in globals().items() if k.startswith("s_")}

if __name__ == "__main__":
    names = sys.argv[1:] or list(SCENARIOS)
    for n in names:
        SCENARIOS[n]()
