#!/usr/bin/env python3
"""attention_sass.py — what the tensor-core attention's main loops cost per tile, read from the
SASS that ptxas makes for a GPU (sm_90 by default), on a machine with no GPU.

The attention kernels (engine/backend/cuda/kernels/cuk_attention_tc.cu) issue far more non-mma
instructions than mma ones (index arithmetic, masks, the softmax, bf16 packing), so on a GPU
their speed follows the instruction count of the key/query tile loop as much as its mma count.
This script builds the file twice with nvcc: as shipped, for each kernel's registers and spills
(ptxas -v), and with -DTC_HOT, which takes every block-uniform "whole, aligned tile" test as
true so that the main loop's SASS is its hot path alone; then it finds, in each kernel, the
innermost loop holding HMMAs and counts its instructions by kind. "instr/HMMA" is the figure
to lower. A loop nested inside the main loop (a load loop the compiler did not unroll) runs
several times per tile: it is listed, and its instructions then count once where they run
several times.

Usage: scripts/bench/attention_sass.py [--arch sm_90] [--kernels REGEX] [SOURCE.cu]
Needs nvcc and cuobjdump: cuobjdump from $CUOBJDUMP, PATH or /usr/local/cuda/bin; where the
toolkit lacks it, `python3 -m pip install --target /tmp/cuobj nvidia-cuda-cuobjdump` and
CUOBJDUMP=$(find /tmp/cuobj -name cuobjdump -type f).
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_SRC = os.path.join(ROOT, "engine/backend/cuda/kernels/cuk_attention_tc.cu")
INS = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def find_cuobjdump():
    for c in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit("attention_sass: no cuobjdump (set CUOBJDUMP; see this script's docstring)")


def build(src, arch, out, extra):
    """nvcc -cubin of src; returns {kernel: (registers, spill bytes)} from ptxas -v."""
    cmd = ["nvcc", f"-arch={arch}", "-cubin", "-o", out, "-Xptxas", "-v", *extra, src]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=os.path.dirname(src))
    if p.returncode != 0:
        sys.exit(f"attention_sass: {' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    res, cur, spill = {}, None, 0
    for line in p.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and cur:
            spill = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            res[cur] = (int(m.group(1)), spill)
            cur = None
    return res


def build_hot(src, arch, tmp):
    """The -DTC_HOT build (the tile loops' hot path alone); returns the cubin's path."""
    out = os.path.join(tmp, "hot.cubin")
    build(src, arch, out, ["-DTC_HOT"])
    return out


def sass(cuobjdump, cubin):
    """{kernel: [(address, opcode, text)]}"""
    out = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    funcs, cur = {}, None
    for line in out.splitlines():
        m = re.search(r"Function : (\w+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = INS.match(line)
        if m and cur is not None:
            text = m.group(2)
            op = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]
            cur.append((int(m.group(1), 16), op, text))
    return funcs


def loops(ins):
    """(first, last) address of every loop: a branch back to an earlier address."""
    out = []
    for a, op, text in ins:
        if op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", text)
            if m and int(m.group(1), 16) < a:
                out.append((int(m.group(1), 16), a))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", nargs="?", default=DEFAULT_SRC)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--kernels", default=r"cuk_att_tc_(fwd|dq|dkv)", help="regex of kernel names")
    a = ap.parse_args()
    src = os.path.abspath(a.source)
    cuobjdump = find_cuobjdump()
    with tempfile.TemporaryDirectory() as tmp:
        regs = build(src, a.arch, os.path.join(tmp, "k.cubin"), [])
        hot = sass(cuobjdump, build_hot(src, a.arch, tmp))
    print(f"{os.path.relpath(src, ROOT)} for {a.arch}: the tile loop's hot path (TC_HOT), per warp and tile")
    print(f"{'kernel':26s} {'regs':>4s} {'spill':>5s} {'instr':>6s} {'HMMA':>5s} {'instr/HMMA':>10s}  by kind")
    for k in sorted(hot):
        if not re.search(a.kernels, k):
            continue
        ins = hot[k]
        ls = loops(ins)
        with_mma = [(lo, hi) for lo, hi in ls
                    if any(op.startswith("HMMA") for ad, op, _ in ins if lo <= ad <= hi)]
        if not with_mma:
            continue
        lo, hi = min(with_mma, key=lambda r: r[1] - r[0])  # the innermost one
        body = [op for ad, op, _ in ins if lo <= ad <= hi]
        kinds = collections.Counter(op.split(".")[0] for op in body)
        inner = [(l2, h2) for l2, h2 in ls if lo <= l2 and h2 <= hi and (l2, h2) != (lo, hi)]
        r, s = regs.get(k, (0, 0))
        mix = " ".join(f"{op}:{n}" for op, n in kinds.most_common(8))
        print(f"{k:26s} {r:4d} {s:5d} {len(body):6d} {kinds['HMMA']:5d} {len(body) / kinds['HMMA']:10.1f}  {mix}")
        for l2, h2 in inner:
            n = sum(1 for ad, _, _ in ins if l2 <= ad <= h2)
            print(f"{'':26s} inner loop {l2:#x}-{h2:#x}: {n} instructions, run more than once a tile")


if __name__ == "__main__":
    main()
