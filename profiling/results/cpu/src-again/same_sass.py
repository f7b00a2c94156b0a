"""Whether two many.py runs (../depth4/many.py OUT.json) compiled the same cubins, launch by
launch: the SASS encodings compared (cuobjdump -sass of each row's cubin; addresses and comments
left out).
    python same_sass.py A.json B.json"""
import json
import os
import subprocess
import sys

import triton

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def encodings(cubin: str) -> list[str]:
    text = subprocess.run([CUOBJDUMP, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    return [line.split("/*")[2] for line in text.splitlines() if line.count("/*") >= 2]


def main():
    a, b = (json.load(open(p)) for p in sys.argv[1:3])
    assert [(r["workload"], r["pass"]) for r in a] == [(r["workload"], r["pass"]) for r in b]
    for x, y in zip(a, b):
        same = encodings(x["cubin"]) == encodings(y["cubin"])
        print(f"{x['workload']:20s} {x['pass']:8s} {'same SASS' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
