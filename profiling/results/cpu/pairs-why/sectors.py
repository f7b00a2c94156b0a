"""The 32-byte sectors and 128-byte lines one row of default's head touches when its pairs' halves
A = x[:, acol] and B = x[:, bcol] are each read (and written) as their own access, against the
row's own sectors (the partner form's x load and out store: 16-byte vectors, every sector once).
Static arithmetic from rome.launch.halves_pairs of 44/44/40's half rotations, a row's start
aligned to its size (x contiguous, D = 128). python sectors.py"""
import rome
from rome import launch

src = launch._signed_gather(launch.describe(rome.rotation_matrix((44, 44, 40), "half")), False)[0][:-1]
cols, run = launch.halves_pairs(src)
acol, bcol = cols[:64].tolist(), cols[64:].tolist()
for name, size in (("bf16", 2), ("fp32", 4)):
    row = 128 * size
    touched = {k: sorted({c * size // 32 for c in cs}) for k, cs in (("A", acol), ("B", bcol))}
    lines = {k: sorted({c * size // 128 for c in cs}) for k, cs in (("A", acol), ("B", bcol))}
    both = sorted(set(touched["A"]) & set(touched["B"]))
    n = len(touched["A"]) + len(touched["B"])
    print(f"{name}: row {row} B = {row // 32} sectors; A touches {len(touched['A'])} sectors on {len(lines['A'])} "
          f"lines, B {len(touched['B'])} on {len(lines['B'])}: {n} sector accesses a row for {row // 32} "
          f"({n / (row // 32):.3f}x), {len(both)} sectors written partly by each (A's pieces {run * size} B)")
