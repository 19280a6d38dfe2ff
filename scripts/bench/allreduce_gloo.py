#!/usr/bin/env python3
"""allreduce_gloo.py - torch.distributed gloo all-reduce bus bandwidth on loopback, the peer that
scripts/bench/allreduce.sh compares build/bench/allreduce against. Same table format:
bytes, time_us, algbw_GBs, busbw_GBs (busbw = bytes * 2(n-1)/n / time)."""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.nproc)
    n = args.nproc
    if rank == 0:
        print(f"{'bytes':>12} {'time_us':>12} {'algbw_GBs':>10} {'busbw_GBs':>10}", flush=True)
    size = args.min
    while size <= args.max:
        t = torch.ones(size // 4, dtype=torch.float32)
        t0 = time.perf_counter()
        for _ in range(3):
            dist.all_reduce(t)
        per = (time.perf_counter() - t0) / 3
        iters = torch.tensor([args.time / max(per, 1e-7)])
        dist.broadcast(iters, 0)
        iters = int(min(max(iters.item(), 5), 10000))
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        dt = (time.perf_counter() - t0) / iters
        if rank == 0:
            alg = size / dt / 1e9
            print(f"{size:12d} {dt * 1e6:12.1f} {alg:10.3f} {alg * 2 * (n - 1) / n:10.3f}", flush=True)
        size *= 2
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--min", type=int, default=1024)
    p.add_argument("--max", type=int, default=64 << 20)
    p.add_argument("--time", type=float, default=0.5)
    args = p.parse_args()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(worker, args=(args, port), nprocs=args.nproc)


if __name__ == "__main__":
    main()
