#!/usr/bin/env python3
"""loop_insns.py - instructions per element in the innermost loops of one
kernel function, counted from the object file's disassembly (objdump -d).

  bench/c/loop_insns.py OBJDUMP OBJECT FUNCTION LANES

A loop is a backward branch inside FUNCTION; innermost loops are those that
contain no other. For each, it counts the instructions between the branch
target and the branch (inclusive, one pass through the body), the vector
stores and the fused multiply-adds, and the elements one pass handles:
LANES (fp32 lanes of one vector: 4 NEON, 8 AVX2, 16 AVX-512) times the
vector stores of a loop that stores (an element-wise pass: one output vector
per input vector) or times the FMAs of a loop that does not (a row sum: one
FMA per input vector). Loops that fit neither (scalar tails, copies) are
listed with '-'. Prints one line per loop, largest first:
  insns  stores  fmas  elements  insns/element  kind  address  mnemonics
where mnemonics counts each instruction of the body (the signature that
tells which loop is which: e.g. NEON RMSNorm y = x r w is ldr, fmul, ldr,
fmul, str per vector; with a prefetch (prfm / prefetcht1) it is the
streaming-store variant).
"""
import collections
import re
import subprocess
import sys

# the vector stores and FMAs of each ISA's hot loops
# (x86 in AT&T syntax: a store's memory operand is its last)
STORE = re.compile(r"^(str\s+q|stp\s+q|st1\s|vmov\S*\s+%[xyz]mm\d+,\s*-?(0x[0-9a-f]+)?\()")
FMA = re.compile(r"^(fmla\s+v\d+\.4s|vfmadd\d+ps|vfnmadd\d+ps)")
BRANCH = re.compile(r"^(b\.\w+|cbn?z|tbn?z|b|j\w+)\s+([0-9a-f]+)\s*<")


def disassemble(objdump, obj, func):
    out = subprocess.run([objdump, "-d", "--no-show-raw-insn", obj], check=True,
                         capture_output=True, text=True).stdout
    insns, inside = [], False
    for line in out.splitlines():
        if re.match(r"^[0-9a-f]+ <%s>:$" % re.escape(func), line):
            inside = True
            continue
        if inside and (not line.strip() or re.match(r"^[0-9a-f]+ <", line)):
            break
        m = re.match(r"^\s*([0-9a-f]+):\s+(.*)$", line) if inside else None
        if m:
            insns.append((int(m.group(1), 16), m.group(2).split("//")[0].split("#")[0].strip()))
    return insns


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    objdump, obj, func, lanes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    insns = disassemble(objdump, obj, func)
    if not insns:
        sys.exit("loop_insns: no function %s in %s" % (func, obj))
    index = {a: i for i, (a, _) in enumerate(insns)}
    loops = []
    for i, (addr, text) in enumerate(insns):
        m = BRANCH.match(text)
        if m and int(m.group(2), 16) < addr and int(m.group(2), 16) in index:
            loops.append((index[int(m.group(2), 16)], i))
    inner = [(s, e) for s, e in loops
             if not any((s2, e2) != (s, e) and s <= s2 and e2 <= e for s2, e2 in loops)]
    rows = []
    for s, e in inner:
        body = [t for _, t in insns[s:e + 1]]
        stores = sum(1 for t in body if STORE.match(t))
        fmas = sum(1 for t in body if FMA.match(t))
        elems = lanes * stores if stores else lanes * fmas
        kind = "element-wise" if stores else "row sum" if fmas else "-"
        mn = collections.Counter(t.split()[0] for t in body)
        sig = " ".join("%s:%d" % kv for kv in sorted(mn.items()))
        rows.append((len(body), stores, fmas, elems, kind, insns[s][0], sig))
    rows.sort(key=lambda r: -r[0])
    print("insns  stores  fmas  elements  insns/element  kind          address  mnemonics")
    for n, st, fm, el, kind, addr, sig in rows:
        per = "%.3f" % (n / el) if el else "-"
        print("%5d  %6d  %4d  %8d  %13s  %-12s  %7x  %s" % (n, st, fm, el, per, kind, addr, sig))


if __name__ == "__main__":
    main()
