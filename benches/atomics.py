#!/usr/bin/env python3
"""Atomic instructions executed per call of an overhead row, by function (or by site).

An atomic read-modify-write (a `lock`-prefixed instruction, or `xchg` with memory: an `Arc`'s
count going up or down, a mutex taken or let go, a counter added to) costs about 7 ns on the
VMs these benches run on even when no other thread touches the line, because it waits for
every store before it to drain. Instruction counts weigh it as one instruction, so this counts
them apart: callgrind gives how often each instruction ran, the binary's disassembly which
ones are atomic.

    B=$(cargo bench -p seawall-benches --bench overhead --no-run 2>&1 | sed -n 's/.*Executable .* (\\(.*\\))$/\\1/p')
    valgrind --tool=callgrind --dump-instr=yes --compress-strings=no --compress-pos=no \\
        --callgrind-out-file=row.out $B --bench --profile-time 1 '^overhead/seawall_recommended$'
    python3 benches/atomics.py row.out $B            # per call, by function
    python3 benches/atomics.py row.out $B --sites    # by instruction, with its source lines

`--sites` needs line tables in the binary: build it with
`CARGO_PROFILE_BENCH_DEBUG=line-tables-only` (in a target directory of its own). A call is
one call of the bench's no-op inner service.
"""

import collections
import re
import subprocess
import sys


def atomic_addresses(binary):
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary],
                         capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if not m:
            continue
        op, args = m.group(2), m.group(3)
        if op == "lock" or (op.startswith("xchg") and "(" in args):
            found[int(m.group(1), 16)] = f"{op} {args.split()[0] if args else ''}"
    return found


def count(profile, binary, atomic):
    """(atomic executions by (address, function), calls of the inner service)."""
    counts = collections.Counter()
    calls = 0
    obj = fn = callee = None
    after_call = False
    with open(profile) as f:
        for line in f:
            if line.startswith("ob="):
                obj = line[3:].strip()
            elif line.startswith("fn="):
                fn, after_call = line[3:].strip(), False
            elif line.startswith("cfn="):
                callee = line[4:].strip()
            elif line.startswith("calls="):
                after_call = True
                if callee and "Noop as tower_service::Service" in callee and ">::call" in callee:
                    calls += int(line[6:].split()[0])
            elif line.startswith("0x"):
                if after_call:  # the inclusive cost of the call just named, not an instruction's
                    after_call = False
                    continue
                parts = line.split()
                if obj and binary in obj and len(parts) > 2:
                    addr = int(parts[0], 16)
                    if addr in atomic:
                        counts[(addr, fn)] += int(parts[2])
    return counts, calls


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    profile, binary = sys.argv[1], sys.argv[2]
    atomic = atomic_addresses(binary)
    counts, calls = count(profile, binary, atomic)
    if calls == 0:
        sys.exit("no call of the no-op inner service in the profile: not an overhead row?")
    total = sum(counts.values()) / calls
    print(f"atomic instructions per call: {total:.1f} ({calls} calls)")
    if "--sites" in sys.argv[3:]:
        for (addr, fn), n in sorted(counts.items(), key=lambda kv: -kv[1]):
            if n / calls < 0.5:
                continue
            lines = subprocess.run(["addr2line", "-i", "-e", binary, hex(addr)],
                                   capture_output=True, text=True).stdout.split()
            ours = [re.sub(r".*/(crates/)?", "", l) for l in lines
                    if "/seawall-" in l or "/registry/" in l]
            print(f"{n / calls:5.1f}  {atomic[addr]:18s} {' < '.join(ours[:3]) or '?'}  | {fn[:70]}")
    else:
        by_fn = collections.Counter()
        for (_, fn), n in counts.items():
            by_fn[fn] += n
        for fn, n in by_fn.most_common():
            if n / calls >= 0.5:
                print(f"{n / calls:5.1f}  {fn[:140]}")


if __name__ == "__main__":
    main()
