#!/usr/bin/env python3
"""Opcode counts of each loop body in a cuobjdump -sass listing (a backward branch's target to the branch).

usage: sass_loops.py LISTING [FUNCTION_SUBSTRING]

Per function: its instruction count, then every loop of more than 40 instructions with its HMMA count and
its most frequent opcodes (predicates and modifiers stripped): where a kernel's instructions per MMA go.
"""
import collections
import re
import sys


def functions(text):
    funcs, name = {}, None
    for line in text.split("\n"):
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = m.group(1)
            funcs[name] = []
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and name:
            funcs[name].append((int(m.group(1), 16), m.group(2).strip()))
    return funcs


def opcode(ins):
    return re.sub(r"^@!?U?P\w+ ", "", ins).split()[0].split(".")[0]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    want = sys.argv[2] if len(sys.argv) > 2 else ""
    for name, ins in functions(open(sys.argv[1]).read()).items():
        if want not in name:
            continue
        print(f"{name}: {len(ins)} instructions")
        for addr, text in ins:
            m = re.search(r"BRA (0x[0-9a-f]+)", text)
            if not m or int(m.group(1), 16) >= addr:
                continue
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            if len(body) <= 40:
                continue
            counts = collections.Counter(opcode(t) for t in body)
            top = ", ".join(f"{k} {v}" for k, v in counts.most_common(12))
            print(f"  loop {int(m.group(1), 16):#x}-{addr:#x}: {len(body)} instructions, HMMA {counts['HMMA']}: {top}")


if __name__ == "__main__":
    main()
