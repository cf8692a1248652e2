"""Small DDP training script (CPU, gloo) whose failure mode is chosen with --mode.

Every step prints a wall-clock timestamp so a reader can see when output stops.
"""
import argparse
import ctypes
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record


def ts():
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def log(msg):
    print(f"{ts()} rank{dist.get_rank() if dist.is_initialized() else '?'} {msg}", flush=True)


class Blocking(torch.utils.data.Dataset):
    """Dataset that serves `ok` items, then blocks forever (a stuck data source)."""

    def __init__(self, n, ok, dim, big=0):
        self.n, self.ok, self.dim, self.big = n, ok, dim, big

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.ok is not None and i >= self.ok:
            time.sleep(10**6)
        if self.big:
            return torch.randn(self.big)
        return torch.randn(self.dim), torch.randn(1)


@record
def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="healthy")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-step", type=int, default=3)
    p.add_argument("--step-sleep", type=float, default=0.3)
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--ckpt-pause", type=float, default=0.0)
    p.add_argument("--ckpt-fileobj", action="store_true", help="torch.save into an open Python file")
    p.add_argument("--pid-dir", default=None)
    p.add_argument("--cgroup", default=None)
    p.add_argument("--dim", type=int, default=64)
    a = p.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    log(f"init_process_group done: backend=gloo world_size={world} pid={os.getpid()}")
    if a.pid_dir:
        with open(os.path.join(a.pid_dir, f"rank{rank}.pid"), "w") as f:
            f.write(str(os.getpid()))

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(a.dim, a.dim), nn.ReLU(), nn.Linear(a.dim, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    me = rank == a.fail_rank

    if a.mode == "stalled_all_tqdm":
        from tqdm import tqdm
        ds = Blocking(10**6, ok=6 * 4 * 2, dim=a.dim)
        dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=1)
        bar = tqdm(dl, desc="Epoch 1", total=100, disable=rank != 0, mininterval=0, dynamic_ncols=False, ncols=100)
        for step, (x, y) in enumerate(bar):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            bar.set_postfix(loss=f"{loss.item():.3f}")
            log(f"step {step} loss {loss.item():.4f}")
            time.sleep(a.step_sleep)
        return

    if a.mode == "shm":
        ds = Blocking(64, ok=None, dim=a.dim, big=4 * 1024 * 1024)  # 16 MiB float tensors
        dl = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2)
        for step, x in enumerate(dl):
            log(f"step {step} batch {tuple(x.shape)} sum {x.sum().item():.2f}")
        return

    if a.mode == "tqdm":
        from tqdm import tqdm
        bar = tqdm(range(a.steps), desc="Epoch 1", disable=rank != 0, mininterval=0, ncols=100)
    else:
        bar = range(a.steps)

    for step in bar:
        x, y = torch.randn(16, a.dim), torch.randn(16, 1)
        if me and step == a.fail_step:
            if a.mode == "keyerror":
                batch = {"input_ids": x}
                y = batch["labels"]
            elif a.mode == "stall":
                log(f"step {step}: this rank stops here (sleeps forever)")
                time.sleep(10**6)
            elif a.mode == "segv":
                ctypes.string_at(0)
            elif a.mode == "abort":
                os.abort()
            elif a.mode == "cpu_alloc":
                big = torch.empty(2**45)
            elif a.mode == "oom":
                if a.cgroup:
                    with open(os.path.join(a.cgroup, "cgroup.procs"), "w") as f:
                        f.write(str(os.getpid()))
                    log(f"moved pid {os.getpid()} into memory cgroup {a.cgroup}")
                hold = []
                while True:
                    hold.append(torch.ones(64 * 1024 * 1024 // 4))  # 64 MiB, touched
                    log(f"holding {len(hold) * 64} MiB of activations")
        out = model(x)
        loss = nn.functional.mse_loss(out, y)
        opt.zero_grad()
        if a.mode == "mismatch" and step == a.fail_step:
            n = 10 if rank == 0 else 20
            t = torch.ones(n)
            log(f"step {step} all_reduce tensor numel={n}")
            dist.all_reduce(t)
        loss.backward()
        opt.step()
        if a.mode == "tqdm":
            bar.set_postfix(loss=f"{loss.item():.3f}")
        elif a.mode == "hf":
            if rank == 0 and (step + 1) % 5 == 0:
                print({"loss": round(loss.item(), 4), "grad_norm": round(sum(p.grad.norm().item() ** 2 for p in model.parameters()) ** 0.5, 6),
                       "learning_rate": 5e-05 * (1 - step / a.steps), "epoch": round((step + 1) / a.steps * 3, 2)}, flush=True)
        else:
            log(f"step {step} loss {loss.item():.4f}")
        if a.ckpt_every and (step + 1) % a.ckpt_every == 0 and a.ckpt_dir:
            dist.barrier()
            if rank == 0:
                path = os.path.join(a.ckpt_dir, f"checkpoint-{step + 1}.pt")
                log(f"saving checkpoint to {path}")
                time.sleep(a.ckpt_pause)
                state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}
                if a.ckpt_fileobj:
                    with open(path, "wb") as f:
                        torch.save(state, f)
                else:
                    torch.save(state, path)
                log(f"checkpoint saved: {path} ({os.path.getsize(path)} bytes)")
            dist.barrier()
        time.sleep(a.step_sleep)
    if a.mode == "hf" and rank == 0:
        print({"train_runtime": 12.3456, "train_samples_per_second": 51.8, "train_steps_per_second": 3.24, "train_loss": round(loss.item(), 4), "epoch": 3.0}, flush=True)
    log("training finished")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
