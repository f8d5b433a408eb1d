"""Compare the SASS of the sm_90a symmetric kernel's instances in two builds.

    python3 lab/kernels/sass_counts.py BEFORE.so|.o… -- AFTER.so|.o…

For every `sym_product_kernel` instance: its instruction count and the counts of the
instructions that make the kernel (HGMMA, UTMALDG, UTMASTG, STSM, LDSM, SYNCS), then whether
its SASS is the same instruction for instruction (addresses and branch targets aside), the
same instructions in another order or with other registers, the same count and the same
kernel instructions with some other opcodes exchanged (named), or different counts (exit 1). Instances
of one side only are listed (an OFF build of DMUON_EXPERIMENTAL_KERNELS has 11 of the 18
instances per element type). Needs `cuobjdump` (CUDA toolkit, or $CUOBJDUMP).
"""

from __future__ import annotations

import collections
import difflib
import os
import re
import shutil
import subprocess
import sys

KINDS = ("HGMMA", "UTMALDG", "UTMASTG", "STSM", "LDSM", "SYNCS")
INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def cuobjdump() -> str:
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        sys.exit("sass_counts: no cuobjdump on PATH (set CUOBJDUMP)")
    return tool


def kernels(paths: list[str]) -> dict[str, list[str]]:
    """{instance: its instructions, addresses and immediates masked}."""
    found: dict[str, list[str]] = {}
    for path in paths:
        text = subprocess.run([cuobjdump(), "-sass", path], capture_output=True, text=True, check=True).stdout
        name = None
        for line in text.splitlines():
            head = re.match(r"\s*Function : (\S+)", line)
            if head:
                name = head.group(1) if "sym_product_kernel" in head.group(1) else None
                if name:
                    found[name] = []
                continue
            match = INSTRUCTION.match(line)
            if name and match:
                found[name].append(re.sub(r"0x[0-9a-f]+", "#", re.sub(r"\s+", " ", match.group(1))))
    return found


def opcode(instruction: str) -> str:
    words = [w for w in instruction.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else ""


def short(name: str) -> str:
    match = re.search(r"cutlass(\d+\w+?_t)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E", name)
    if not match:
        return name
    elem, stages, epilogue, cluster, tile_n = match.groups()
    return f"{elem.lstrip('0123456789')} s{stages} epi{epilogue} cluster{cluster} n{tile_n}"


def main(argv: list[str]) -> int:
    if "--" not in argv:
        sys.exit(__doc__)
    split = argv.index("--")
    before, after = kernels(argv[:split]), kernels(argv[split + 1:])
    verdicts = collections.Counter()
    for name in sorted(set(before) | set(after), key=short):
        if name not in before or name not in after:
            print(f"{short(name):40s} only {'before' if name in before else 'after'}")
            continue
        a, b = before[name], after[name]
        counts = [(k, sum(opcode(i) == k for i in a), sum(opcode(i) == k for i in b)) for k in KINDS]
        if a == b:
            verdict = "identical"
        else:
            ops_a, ops_b = collections.Counter(map(opcode, a)), collections.Counter(map(opcode, b))
            moved = len(a) - sum(m.size for m in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())
            if ops_a == ops_b:
                verdict = f"same opcodes, {moved} of {len(a)} lines moved or with other registers"
            elif len(a) == len(b) and all(ops_a[k] == ops_b[k] for k in KINDS):
                extra = ", ".join(f"{k} {ops_a[k]}->{ops_b[k]}" for k in sorted(set(ops_a) | set(ops_b))
                                  if ops_a[k] != ops_b[k])
                verdict = f"same count and kernel instructions ({extra}), {moved} of {len(a)} lines moved or changed"
            else:
                verdict = "DIFFERENT COUNTS"
        verdicts[verdict.split(" (")[0].split(",")[0]] += 1
        print(f"{short(name):40s} {len(a):5d}/{len(b):<5d} " +
              " ".join(f"{k}={x}" + ("" if x == y else f"->{y}") for k, x, y in counts) + f"  {verdict}")
    print(dict(verdicts))
    return 1 if verdicts["DIFFERENT COUNTS"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
