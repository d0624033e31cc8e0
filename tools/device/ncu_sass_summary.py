#!/usr/bin/env python3
"""Summarizes one kernel of an Nsight Compute SASS source export.

Input: the CSV of `ncu -i REPORT --page source --print-source sass --csv` (plain or .xz), one section
per profiled launch, each starting with a "Kernel Name" line. Prints, for the chosen launch, the executed
instructions by opcode (with the ratio to a reference opcode, e.g. per HMMA) and the instructions with the
most warp-stall samples and their main reasons: where a kernel's issue slots and stalls go.

    python3 tools/device/ncu_sass_summary.py source.csv.xz --launch 8 [--per HMMA] [--top 20]
    python3 tools/device/ncu_sass_summary.py source.csv.xz --list
"""
import argparse
import collections
import csv
import lzma
import sys

STALLS = ["stall_long_sb", "stall_wait", "stall_math", "stall_not_selected", "stall_selected", "stall_barrier",
          "stall_short_sb", "stall_dispatch", "stall_mio", "stall_lg"]


def sections(path):
    """Yields (kernel name, rows as dicts) per launch."""
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", newline="") as f:
        name, header, rows = None, None, []
        for r in csv.reader(f):
            if not r:
                continue
            if r[0] == "Kernel Name":
                if name is not None:
                    yield name, rows
                name, header, rows = r[1] if len(r) > 1 else "?", None, []
            elif header is None:
                header = r
            else:
                rows.append(dict(zip(header, r)))
        if name is not None:
            yield name, rows


def num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def opcode(source):
    parts = source.split()
    if not parts:
        return "?"
    op = parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]
    return op.split(".")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--launch", type=int, default=0, help="section index (see --list)")
    ap.add_argument("--list", action="store_true", help="list the sections: index, executed instructions, name")
    ap.add_argument("--per", default="HMMA", help="reference opcode for the per-instruction ratio")
    ap.add_argument("--top", type=int, default=20, help="instructions with the most stall samples to print")
    a = ap.parse_args()
    found = False
    for i, (name, rows) in enumerate(sections(a.csv)):
        executed = sum(num(r.get("Instructions Executed", 0)) for r in rows)
        if a.list:
            print(f"{i:3d} {executed:14.0f}  {name[:120]}")
            continue
        if i != a.launch:
            continue
        found = True
        samples = sum(num(r.get("Warp Stall Sampling (All Samples)", 0)) for r in rows)
        count, stall = collections.Counter(), collections.Counter()
        for r in rows:
            op = opcode(r.get("Source", ""))
            count[op] += num(r.get("Instructions Executed", 0))
            stall[op] += num(r.get("Warp Stall Sampling (All Samples)", 0))
        ref = count.get(a.per, 0)
        print(f"launch {i}: {name}")
        print(f"{len(rows)} SASS instructions, {executed:.0f} executed (warp level), {samples:.0f} stall samples")
        print(f"{'opcode':12s} {'executed':>12s} {'share':>6s} {'per ' + a.per:>10s} {'samples':>8s}")
        for op, c in count.most_common():
            if c == 0:
                break
            per = f"{c / ref:10.2f}" if ref else f"{'-':>10s}"
            print(f"{op:12s} {c:12.0f} {100 * c / executed:5.1f}% {per} {stall[op]:8.0f}")
        print(f"\ntop {a.top} instructions by stall samples (index, executed, samples, main reasons, SASS):")
        ranked = sorted(enumerate(rows), key=lambda ir: -num(ir[1].get("Warp Stall Sampling (All Samples)", 0)))
        for idx, r in ranked[: a.top]:
            reasons = sorted(((num(r.get(k, 0)), k[6:]) for k in STALLS), reverse=True)[:2]
            why = ", ".join(f"{k} {v:.0f}" for v, k in reasons if v > 0)
            print(f"{idx:5d} {num(r.get('Instructions Executed', 0)):9.0f} "
                  f"{num(r.get('Warp Stall Sampling (All Samples)', 0)):6.0f}  {why:32s} {r.get('Source', '')[:80]}")
    if not a.list and not found:
        sys.exit(f"{a.csv}: no launch {a.launch} (see --list)")


if __name__ == "__main__":
    main()
