"""Where each SASS listing under DIR touches its stack frame: every STL/LDL and how many loops
(backward branches' ranges) hold it; 0: outside every loop, once a program.

    python stack_where.py DIR"""
import re
import sys
from pathlib import Path

for f in sorted(Path(sys.argv[1]).glob("*.sass")):
    ins = [(int(m.group(1), 16), m.group(2)) for line in f.read_text().splitlines()
           if (m := re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line))]
    loops = [(int(m.group(1), 16), a) for a, t in ins
             if (m := re.search(r"BRA(?:\.U)?\s+(?:!?U?P\d,\s*)?0x([0-9a-f]+)", t)) and int(m.group(1), 16) < a]
    hits = [f"{t.split()[1] if t.startswith('@') else t.split()[0]}@{a:x}:loops{sum(s <= a <= e for s, e in loops)}"
            for a, t in ins if re.search(r"\b(STL|LDL)", t)]
    if hits:
        print(f.name, hits)
