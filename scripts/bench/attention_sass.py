#!/usr/bin/env python3
"""attention_sass.py — what the tensor-core attention's main loops cost per tile, read from the
SASS that ptxas makes for a GPU (sm_90 by default), on a machine with no GPU.

The attention kernels (engine/backend/cuda/kernels/cuk_attention_tc.cu) issue far more non-mma
instructions than mma ones (index arithmetic, masks, the softmax, bf16 packing, tile copies), so
on a GPU their speed follows the instruction count of the key/query tile loop as much as its
mma count. For each kernel this script finds the innermost loop holding HMMAs and prints:

- "as built": the kernel as shipped, its registers and spills (ptxas -v), and the instructions
  of its unmasked tile's path through that loop. The path is found on the SASS's control flow
  (forward branches only): the path from the loop's head to its back edge with the most HMMAs,
  then the most cp.async copies (a tile that also issues the next), then the fewest
  instructions. This is the figure to lower.
- "ideal": the same loop built with -DTC_HOT, which takes every block-uniform "whole, aligned
  tile" test as true, so the compiler sees the unmasked path alone. When "as built" is far above
  it, the compiler did not give the unmasked tiles their own copy of the code and they pay
  tests and branches meant for the masked ones (Session 31 found the dK/dV loop at 1031
  instructions against an ideal 553, and split its loops, docs/perf.md).

Usage: scripts/bench/attention_sass.py [--arch sm_90] [--kernels REGEX] [--path KERNEL] [SOURCE.cu]
(--path prints the as-built path of one kernel, instruction by instruction.)
Needs nvcc and cuobjdump: cuobjdump from $CUOBJDUMP, PATH or /usr/local/cuda/bin; where the
toolkit lacks it, `python3 -m pip install --target /tmp/cuobj nvidia-cuda-cuobjdump` and
CUOBJDUMP=$(find /tmp/cuobj -name cuobjdump -type f); cuobjdump runs nvdisasm, from
nvidia-cuda-nvdisasm the same way, on PATH.
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
    """{kernel: [(address, opcode, text, predicated)]}"""
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
            pred = re.match(r"^@!?U?P\w+\s+", text) is not None
            op = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]
            cur.append((int(m.group(1), 16), op, text, pred))
    return funcs


def target(text):
    m = re.search(r"0x([0-9a-f]+)\s*$", text)
    return int(m.group(1), 16) if m else None


def tile_loop(ins):
    """(first, last) address of the innermost loop holding HMMAs (a branch back to an earlier
    address), or None."""
    ls = [(target(t), a) for a, op, t, _ in ins
          if op.startswith("BRA") and target(t) is not None and target(t) < a]
    with_mma = [(lo, hi) for lo, hi in ls
                if any(op.startswith("HMMA") for ad, op, _, _ in ins if lo <= ad <= hi)]
    return min(with_mma, key=lambda r: r[1] - r[0]) if with_mma else None


def tile_path(ins, lo, hi):
    """The instructions of the loop's path from its head to its back edge (hi) with the most
    HMMAs, then the most cp.async (LDGSTS), then the fewest instructions: a dynamic program
    over the loop body in address order, forward edges only (an inner loop counts once)."""
    body = [x for x in ins if lo <= x[0] <= hi]
    at = {a: i for i, (a, _, _, _) in enumerate(body)}
    none = (-1, -1, -(10 ** 9))
    best, prev = [none] * len(body), [None] * len(body)
    best[0] = (0, 0, 0)
    end, end_score = None, none
    for i, (a, op, text, pred) in enumerate(body):
        if best[i] == none:
            continue
        h, g, n = best[i]
        here = (h + op.startswith("HMMA"), g + op.startswith("LDGSTS"), n - 1)
        succ = []
        if op.startswith("BRA"):
            t = target(text)
            if a == hi:
                if here > end_score:
                    end, end_score = i, here
                continue
            if t is not None and t > a and t in at:
                succ.append(at[t])
            # "@P BRA" may fall through, and so may "BRA P1, target" (a predicate operand)
            if pred or "," in text.split("BRA", 1)[1].split("0x")[0]:
                succ.append(i + 1)
        elif op.startswith("EXIT") and not pred:
            continue
        else:
            succ.append(i + 1)
        for j in succ:
            if j < len(body) and here > best[j]:
                best[j], prev[j] = here, i
    path, i = [], end
    while i is not None:
        path.append(body[i])
        i = prev[i]
    return path[::-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", nargs="?", default=DEFAULT_SRC)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--kernels", default=r"cuk_att_tc_(fwd|dq|dkv)", help="regex of kernel names")
    ap.add_argument("--path", help="print this kernel's as-built tile path")
    a = ap.parse_args()
    src = os.path.abspath(a.source)
    cuobjdump = find_cuobjdump()
    with tempfile.TemporaryDirectory() as tmp:
        built = os.path.join(tmp, "k.cubin")
        regs = build(src, a.arch, built, [])
        real = sass(cuobjdump, built)
        hot = sass(cuobjdump, build_hot(src, a.arch, tmp))
    print(f"{os.path.relpath(src, ROOT)} for {a.arch}: the unmasked tile's path through the tile "
          "loop, per warp and tile")
    print(f"{'kernel':26s} {'regs':>4s} {'spill':>5s} {'HMMA':>5s} {'as built':>8s} {'/HMMA':>6s} "
          f"{'ideal':>6s} {'/HMMA':>6s}  as built, by kind")
    for k in sorted(real):
        if not re.search(a.kernels, k) and k != a.path:
            continue
        loop, hloop = tile_loop(real[k]), tile_loop(hot.get(k, []))
        if not loop or not hloop:
            continue
        path = tile_path(real[k], *loop)
        ideal = tile_path(hot[k], *hloop)
        kinds = collections.Counter(op.split(".")[0] for _, op, _, _ in path)
        n_mma = kinds["HMMA"]
        r, s = regs.get(k, (0, 0))
        mix = " ".join(f"{op}:{n}" for op, n in kinds.most_common(8))
        print(f"{k:26s} {r:4d} {s:5d} {n_mma:5d} {len(path):8d} {len(path) / n_mma:6.1f} "
              f"{len(ideal):6d} {len(ideal) / max(1, n_mma):6.1f}  {mix}")
        if k == a.path:
            for ad, _, text, _ in path:
                print(f"    {ad:#07x}  {text}")


if __name__ == "__main__":
    main()
