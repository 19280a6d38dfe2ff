#!/usr/bin/env python3
"""mesh_peer.py — the PyTorch peers of scripts/bench/mesh.sh: the GPT of gpt_peer.py (AdamW,
global-norm clipping at 1.0) trained by NPROC processes over gloo on this host, either with
DistributedDataParallel ("ddp") or with FullyShardedDataParallel ("fsdp": FULL_SHARD, i.e.
ZeRO-3, one FSDP unit per transformer block plus the root). Each rank is pinned to its own
slice of the allowed CPUs with cores/NPROC threads (as jdt-train's launcher does) and trains on
its B/NPROC rows of each global batch. Prints one line from rank 0:
    <mode> tok/s <global tokens/s> step_ms <median> loss <last> rss_mb <rank 0> <rank 1> ...
(tokens/s from the median step after two warm-up steps; loss: rank 0's loss of the last step,
the mean over its rows, which DDP and FSDP must agree on; rss_mb = each rank's peak RSS).
Usage: mesh_peer.py ddp|fsdp L C H T B V STEPS NPROC

torch 1.13 (Debian's, on Python 3.11) needs three shims for FSDP on a CPU, applied only in
"fsdp" mode and only in these processes: (1) its sharded-tensor metadata uses a dataclass
instance as a field default, which Python 3.11 refuses at import: torch's own dataclasses are
made hashable while FSDP is imported; (2) FSDP 1.13 is written for CUDA (streams, events,
a cuda compute device): on a CPU every op is synchronous, so the stream/event calls become
no-ops and the compute device is the CPU; (3) its gloo backend lacks _all_gather_base and
_reduce_scatter_base: all-gather is gloo's all_gather into views of the output, reduce-scatter a
ring of point-to-point sends ((n-1)/n of the buffer per rank, what a ring reduce-scatter moves).
The shimmed FSDP gives the single-process losses (checked when this was written).
"""
import contextlib
import dataclasses
import functools
import os
import resource
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_peer import torch_gpt  # noqa: E402


def cpu_fsdp():
    """Imports torch 1.13's FSDP and makes it run on a CPU over gloo (see the module doc)."""
    import torch
    import torch.distributed as dist

    orig = dataclasses._process_class

    def hashable(cls, *a, **k):
        out = orig(cls, *a, **k)
        if out.__module__.startswith("torch.distributed._shard") and out.__hash__ is None:
            out.__hash__ = object.__hash__
        return out

    dataclasses._process_class = hashable
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    finally:
        dataclasses._process_class = orig

    class Stream:
        def wait_stream(self, s):
            pass

        def wait_event(self, e):
            pass

        def synchronize(self):
            pass

    class Event:
        def record(self, s=None):
            pass

        def synchronize(self):
            pass

        def query(self):
            return True

    torch.cuda.is_available = lambda: True
    torch.cuda.Stream = Stream
    torch.cuda.Event = Event
    torch.cuda.current_stream = lambda device=None: Stream()
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.synchronize = lambda device=None: None
    torch.Tensor.record_stream = lambda self, s: None
    FSDP._get_compute_device = lambda self, *a, **k: torch.device("cpu")

    def all_gather_base(output, input, group=None, async_op=False):
        dist.all_gather(list(output.chunk(dist.get_world_size(group))), input, group=group)

    def reduce_scatter_base(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        k, r = dist.get_world_size(group), dist.get_rank(group)
        acc = [c.clone() for c in input.chunk(k)]
        tmp = torch.empty_like(acc[0])
        for s in range(k - 1):  # ring: after k-1 steps rank r holds the sum of chunk r
            req = dist.isend(acc[(r - s - 1) % k], (r + 1) % k, group=group)
            dist.recv(tmp, (r - 1) % k, group=group)
            req.wait()
            acc[(r - s - 2) % k] += tmp
        output.copy_(acc[r])

    dist._all_gather_base = all_gather_base
    dist._reduce_scatter_base = reduce_scatter_base
    return FSDP, transformer_auto_wrap_policy


def worker(mode, L, C, H, T, B, V, steps, nproc, rank, port):
    cpus = sorted(os.sched_getaffinity(0))
    share = max(1, len(cpus) // nproc)
    if len(cpus) >= nproc:
        os.sched_setaffinity(0, cpus[rank * share:(rank + 1) * share])
    import torch
    import torch.distributed as dist

    torch.set_num_threads(share)
    FSDP = policy = None
    if mode == "fsdp":
        FSDP, policy = cpu_fsdp()
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=nproc)
    torch.manual_seed(0)
    model = torch_gpt(L, C, H, T, V)
    if mode == "ddp":
        model = DDP(model)
    else:
        model = FSDP(model, auto_wrap_policy=functools.partial(
            policy, transformer_layer_cls={type(model.blocks[0])}))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    rows = B // nproc
    times = []
    for step in range(steps):
        x = torch.randint(0, V, (B, T), generator=g)[rank * rows:(rank + 1) * rows]
        y = torch.randint(0, V, (B, T), generator=g)[rank * rows:(rank + 1) * rows]
        t0 = time.perf_counter()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if mode == "ddp":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        else:  # FSDP.clip_grad_norm_ moves the norm to CUDA in 1.13: the same sum by hand
            sq = sum((p.grad.detach() ** 2).sum() for p in model.parameters() if p.grad is not None)
            sq = torch.as_tensor(sq, dtype=torch.float32)
            dist.all_reduce(sq)
            scale = min(1.0, 1.0 / (float(sq.sqrt()) + 1e-6))
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        opt.step()
        times.append(time.perf_counter() - t0)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    all_rss = [torch.zeros(1) for _ in range(nproc)]
    dist.all_gather(all_rss, rss)
    if rank == 0:
        warm = sorted(times[min(2, len(times) - 1):])
        med = warm[len(warm) // 2]
        print(f"{mode} tok/s {B * T / med:.1f} step_ms {med * 1e3:.1f} loss {loss.item():.6f} "
              "rss_mb " + " ".join(f"{r.item():.0f}" for r in all_rss), flush=True)
    dist.destroy_process_group()


def main():
    mode = sys.argv[1]
    if mode not in ("ddp", "fsdp"):
        sys.exit("usage: mesh_peer.py ddp|fsdp L C H T B V STEPS NPROC")
    L, C, H, T, B, V, steps, nproc = (int(a) for a in sys.argv[2:10])
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    import torch.multiprocessing as mp

    mp.spawn(spawned, args=(mode, L, C, H, T, B, V, steps, nproc, port), nprocs=nproc)


def spawned(rank, mode, L, C, H, T, B, V, steps, nproc, port):
    worker(mode, L, C, H, T, B, V, steps, nproc, rank, port)


if __name__ == "__main__":
    main()
