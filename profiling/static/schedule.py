"""One launch of a kernel scheduled on one SM from its SASS, at a fixed DRAM latency: the time
its slowest SM takes, and from it the DRAM bandwidth the launch reaches (``model`` turns that into
the estimate against copy; docs/kernels.md states the assumptions).

What it does, in order:

1. **The path of a program** (``program_path``): the instructions one program issues, walked from
   the kernel's entry. A conditional branch whose predicate is known is taken or not (a uniform
   scalar the launch gives, e.g. the gather kernel's permutation class at ``src[D]``, compared with
   ``ISETP`` to an immediate); the closing branch of a *tile loop* (a loop holding a global store)
   is taken until the loop has run the iterations the program's work asks (its elements / what
   one iteration stores); an inner loop without stores runs once (one that loads from global
   memory, e.g. a norm's first sweep over a token's heads, is named in the path's
   ``load_loops_walked_once``: its trips are unknown here, and the model marks the launch
   unmodelled rather than give an estimate that leaves them out); any other conditional branch
   goes the way from which the next wanted event (the next tile loop with work, else ``EXIT``) is
   reachable, the fall-through where both can reach it (the tile loops a program reaches, in order,
   come from a first walk that goes towards any loop not yet entered). A called subroutine's body
   is walked in place of the ``CALL``.
2. **What each load reads** (``classify``): registers are tainted forward along the path by the
   program id (``SR_CTAID``), the thread id, the kernel's parameters (constant bank 0, laid out from
   the launch's signature) and global loads. A load whose address does not depend on the program
   id is read by every program: an L2 hit, no DRAM bytes. One whose address depends on loaded data
   (a gather) and reads a tensor that the program also reads directly (x's partner at ``src``) reads
   lines the direct load brings: no DRAM bytes of its own, and it touches every line of the warp's
   direct load (its L1 wavefronts: at least the direct load's); it completes when the warp's last
   direct load of that tensor does, an L1 hit after that (``simulate``). One that reads again an address an
   earlier load read (``reread_distance``) is an L1 hit, or an L2 hit where the warp loaded more
   than ``l1_bytes`` in between. Every other load is a DRAM round trip whose bytes are distinct.
3. **The SM** (``simulate``): an SM's programs (programs i, i + SMs, ...: program kinds in launch
   order) over its resident CTAs, one CTA per slot, the next program when a slot's warps have all
   exited. One warp scheduler (sub-partition) is simulated: its warps are one in four of the SM's
   (warps are spread over the four, so each sees the same mix) and it has a quarter of the L1
   path. It issues one instruction a clock, oldest-ready warp first; a warp's next instruction waits
   the previous one's stall count and until the scoreboards in its wait mask (or ``DEPBAR``) are
   clear. Fixed latencies (``LATENCY``); a DRAM load completes one DRAM latency after the L1 path
   takes it; every global and shared-memory access holds the L1 path one clock per 128 B wavefront
   (per SM). DRAM bandwidth is not a limit inside the SM (the model caps the rate at copy).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import re
import struct

from .nvidia import GLOBAL, WIDTH, Instr, branch_target, call_target, parse_sass, sass_labels, subroutines

# --- control bits --------------------------------------------------------------------------

_NO_SCOREBOARD = 7


def control_bits(word: int) -> dict:
    """The scheduling control bits of a Volta+ instruction from the second (high) 64-bit word of
    its encoding: ``stall`` cycles, ``yield``, ``write``/``read`` scoreboard (None for 7: none),
    ``wait`` (a mask of scoreboards 0-5 waited on before it issues), ``reuse`` (operand cache)."""
    wb, rb = (word >> 46) & 7, (word >> 49) & 7
    return {"stall": (word >> 41) & 15, "yield": (word >> 45) & 1,
            "write": None if wb == _NO_SCOREBOARD else wb, "read": None if rb == _NO_SCOREBOARD else rb,
            "wait": (word >> 52) & 63, "reuse": (word >> 58) & 15}


_HI_WORD = re.compile(r"^\s*/\* 0x([0-9a-f]{16}) \*/\s*$")


def sass_controls(text: str) -> dict[int, dict]:
    """Address -> ``control_bits`` of every instruction of a ``cuobjdump -sass`` listing that
    kept its encodings (the second word is the ``/* 0x... */`` line after the instruction)."""
    from .nvidia import SASS_LINE

    out, pending = {}, None
    for line in text.splitlines():
        m = SASS_LINE.match(line)
        if m:
            pending = int(m.group(1), 16)
            continue
        h = _HI_WORD.match(line)
        if h and pending is not None:
            out[pending] = control_bits(int(h.group(1), 16))
        pending = None
    return out


SHARED = {"LDS", "STS", "LDSM", "STSM"}
L1_WAVEFRONT = 128  # bytes


def access_bits(ins: Instr) -> int | None:
    """Bits one thread moves in a global or shared-memory access (None: not one)."""
    base, parts = ins.base, ins.opcode.split(".")[1:]
    if base in ("LDSM", "STSM"):  # .x1/.x2/.x4: 8x8 16-bit matrices, one 32-bit register each a thread
        n = next((int(p[1:]) for p in reversed(parts) if p in ("x1", "x2", "x4")), None)
        if n is None:
            n = next((int(p) for p in reversed(parts) if p in ("1", "2", "4")), 1)
        return 32 * n
    if base in GLOBAL or base in SHARED:
        return next((WIDTH[p] for p in parts if p in WIDTH), 32)
    return None


def wavefronts(bits: int) -> int:
    """L1 wavefronts (128 B each) one warp's access of ``bits`` a lane takes, coalesced."""
    return max(1, -(-bits * 32 // 8 // L1_WAVEFRONT))


# --- fixed latencies (cycles), the assumptions of the schedule ----------------------------------

LATENCY = {
    "l2": 270,  # a global load every program reads (an L2 hit): ~150 ns at 1.755 GHz
    "l1": 33,  # shared memory (LDS/LDSM), an L1 hit
    "const": 20,  # LDC (constant cache hit)
    "special": 20,  # S2R / S2UR
    "mufu": 20,  # MUFU, and other variable-latency ALU results (I2F, F2I, FRND, POPC, ...)
    "shfl": 25,
    "operands": 10,  # a memory instruction's read scoreboard: its registers read, after the L1 takes it
    "barrier": 20,  # BAR.SYNC once every warp of the CTA has arrived
}
_VARIABLE_ALU = {"MUFU", "I2F", "F2I", "FRND", "F2F", "POPC", "FLO", "BREV", "I2FP", "F2IP", "DADD", "DMUL",
                 "DFMA", "IMUL", "QSPC"}


# --- the program's path ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Loop:
    start: int
    end: int
    store_bytes: int  # global-store bytes one warp issues in one iteration (one walk of the body)


def _back_edges(instrs: list[Instr], labels: dict, subs) -> list[tuple[int, int]]:
    out = []
    for ins in instrs:
        t = branch_target(ins, labels)
        if t is not None and t < ins.addr and not any(a <= ins.addr <= b for a, b in subs):
            out.append((t, ins.addr))
    return sorted(set(out))


class Kernel:
    """A cubin's SASS, parsed once: instructions, control bits, labels, subroutines, loops."""

    def __init__(self, text: str):
        self.instrs = parse_sass(text)
        self.controls = sass_controls(text)
        if self.instrs and not self.controls:
            raise ValueError("the SASS has no instruction encodings (cuobjdump -sass prints them; "
                             "strip_encodings removed them): the control bits are needed")
        self.labels = sass_labels(text)
        self.subs = subroutines(self.instrs)
        self.index = {ins.addr: n for n, ins in enumerate(self.instrs)}
        self.sub_body = {a: [i for i in self.instrs if a <= i.addr <= b] for a, b in self.subs}
        loops = _back_edges(self.instrs, self.labels, self.subs)
        stores = [i for i in self.instrs if i.base == "STG" and not any(a <= i.addr <= b for a, b in self.subs)]
        with_stores = [(s, e) for s, e in loops if any(s <= i.addr <= e for i in stores)]
        # tile loops: the innermost loops holding a global store
        inner = [(s, e) for s, e in with_stores
                 if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in with_stores)]
        self.tile_loops = {}
        for s, e in inner:
            body = self._body(s, e)
            self.tile_loops[s] = Loop(s, e, sum(access_bits(i) * 32 // 8 for i in body if i.base == "STG"))
        self.loop_ends = {e: s for s, e in loops}
        self._dests: dict[int, list[str]] = {}
        # loops without a store that load from global memory (a first sweep summing a token's
        # heads): the walk runs them once, their trips unknown (see program_path)
        self.load_loops = {s: e for s, e in loops if (s, e) not in with_stores and any(
            i.base in ("LDG", "LDGSTS") for i in self.instrs if s <= i.addr <= e)}

    def dests(self, n: int) -> list[str]:
        """The registers and predicates instruction ``n`` writes (``_read_op``'s, read once)."""
        d = self._dests.get(n)
        if d is None:
            d = self._dests[n] = _read_op(self.instrs[n]).dests
        return d

    def _body(self, s: int, e: int) -> list[Instr]:
        """One walk of a loop body: conditional forward branches not taken, unconditional ones taken,
        inner loops once."""
        out, n = [], self.index[s]
        while n < len(self.instrs) and self.instrs[n].addr <= e and len(out) < 100_000:
            ins = self.instrs[n]
            out.append(ins)
            t = branch_target(ins, self.labels)
            if ins.addr == e:
                break
            if t is not None and t > ins.addr and ins.pred in ("", "@PT") and t <= e:
                n = self.index[t]
                continue
            n += 1
        return out

    def successors(self, n: int) -> list[int | str]:
        """CFG successors of instruction ``n`` (indices; "exit"), forward edges only."""
        ins = self.instrs[n]
        always = ins.pred in ("", "@PT")
        if ins.base == "EXIT":
            return ["exit"] if always else ["exit", n + 1]
        t = branch_target(ins, self.labels)
        if t is not None:
            if t < ins.addr:  # a back edge: leave the loop
                return [n + 1]
            return [self.index[t]] if always else [n + 1, self.index[t]]
        return [n + 1] if n + 1 < len(self.instrs) else ["exit"]

    def first_events(self, n: int) -> set:
        """The events (a tile loop's start address, "exit") first reachable from instruction ``n``
        along forward edges."""
        seen, todo, found = set(), [n], set()
        while todo:
            m = todo.pop()
            if m == "exit":
                found.add("exit")
                continue
            if m in seen or m >= len(self.instrs):
                continue
            seen.add(m)
            addr = self.instrs[m].addr
            if addr in self.tile_loops:
                found.add(addr)
                continue
            todo.extend(self.successors(m))
        return found


_ISETP = re.compile(r"^\s*(U?P\d|U?PT),\s*(U?P\d|U?PT),\s*(U?R\d+),\s*(-?0x[0-9a-f]+|-?\d+),\s*U?PT$")


def _cmp(op: str, a: int, b: int) -> bool | None:
    return {"EQ": a == b, "NE": a != b, "LT": a < b, "LE": a <= b, "GT": a > b, "GE": a >= b}.get(op)


def _walk(kernel: Kernel, trips_for, wanted_for, known_loads: dict, max_steps: int,
          loop_trips: tuple | None = None, tail_bytes: float = 0.0):
    """The walk behind ``program_path``: ``trips_for(loop)`` the iterations of a tile loop,
    ``wanted_for(entered)`` the next event wanted once the tile loops ``entered`` were (a loop's
    start, "exit", or a set of them: any; None or empty: fall through wherever a branch is not
    known); ``loop_trips``: the
    iterations the launch gives of the loops (tile loops and loops that load without storing) in
    the order the program first reaches them, None where the walk derives them (a tile loop's
    from its work; a load loop without them runs once and is named in ``load_loops_walked_once``);
    ``tail_bytes``: what a warp stores outside the tile loops (a loop's last batch peeled after
    it): a predicated exit is not taken before the path has stored that much there."""
    ins_list, idx = kernel.instrs, kernel.index
    known: dict[str, int] = {}
    preds: dict[str, bool] = {}
    order: list[int] = []
    trips: dict[int, int] = {}
    done: dict[int, int] = {}
    path: list[Instr] = []
    once: list[int] = []  # loops without stores that load, walked once
    reached: list[int] = []  # every loop's start, tile or load loop, in first-reach order
    sweep: dict[int, int | None] = {}  # a load loop's trips (None: unknown)
    sdone: dict[int, int] = {}

    def given():
        k = len(reached) - 1
        return loop_trips[k] if loop_trips is not None and k < len(loop_trips) else None

    tail_left = tail_bytes
    n, steps = 0, 0
    while isinstance(n, int) and n < len(ins_list) and steps < max_steps:
        ins = ins_list[n]
        steps += 1
        path.append(ins)
        if tail_left > 0 and ins.base == "STG" and not any(s <= ins.addr <= lp.end
                                                             for s, lp in kernel.tile_loops.items()):
            tail_left -= access_bits(ins) * 32 // 8
        if ins.addr in kernel.tile_loops and ins.addr not in trips:
            reached.append(ins.addr)
            g = given()
            trips[ins.addr] = max(1, int(g)) if g is not None else trips_for(kernel.tile_loops[ins.addr])
            done[ins.addr] = 0
            order.append(ins.addr)
        elif ins.addr in kernel.load_loops and ins.addr not in sweep:
            reached.append(ins.addr)
            g = given()
            sweep[ins.addr] = None if g is None else max(1, int(g))
            sdone[ins.addr] = 0
        base, ops = ins.base, ins.operands
        if (known or preds) and base not in ("ISETP", "UISETP"):  # a register or predicate written
            # again no longer holds what the walk knew of it (ptxas reuses them: the permutation
            # class's predicate overwritten by a carry-out sent the walk down another class's code)
            if base == "R2P":
                preds.clear()
            for d in kernel.dests(n):
                known.pop(d, None)
                preds.pop(d, None)
        if base == "LDG" and ins.addr in known_loads:  # a scalar the launch gives
            known[ops.split(",")[0].strip()] = known_loads[ins.addr]
        elif base in ("ISETP", "UISETP"):
            m = _ISETP.match(ops)
            parts = ins.opcode.split(".")
            r = _cmp(parts[1], known[m.group(3)], int(m.group(4), 0)) \
                if m and m.group(3) in known and len(parts) > 1 else None
            for p in ops.split(",")[:2]:
                preds.pop(p.strip(), None)
            if r is not None and ins.pred in ("", "@PT"):
                preds[m.group(1)] = r
        if base == "CALL" and call_target(ins) in kernel.sub_body:
            path.extend(kernel.sub_body[call_target(ins)])
        always = ins.pred in ("", "@PT")
        if base == "EXIT":
            # a predicated exit inside a tile loop with iterations left is the loop's last-trip
            # exit (ptxas moves the end of the last loop into its body): not taken before then
            unfinished = any(s <= ins.addr <= kernel.tile_loops[s].end and done[s] + 1 < trips[s] for s in trips)
            if always or (wanted_for(order) == "exit" and not unfinished and tail_left <= 0):
                break
            n += 1
            continue
        t = branch_target(ins, kernel.labels)
        if t is None:
            n += 1
            continue
        if t < ins.addr:  # a back edge: a tile loop's runs its iterations, an inner loop once
            loop = kernel.tile_loops.get(t)
            if loop is not None and loop.end == ins.addr:
                done[t] += 1
                n = idx[t] if done[t] < trips[t] else n + 1
            elif t in kernel.load_loops and sweep.get(t) is not None:  # its given trips
                sdone[t] += 1
                if sdone[t] < sweep[t]:
                    n = idx[t]
                else:
                    sdone[t] = 0
                    n += 1
            else:
                if t in kernel.load_loops and t not in once:
                    once.append(t)
                n += 1
            continue
        if always:
            n = idx[t]
            continue
        p = ins.pred.lstrip("@")
        neg, p = p.startswith("!"), p.lstrip("!")
        if p in preds:
            n = idx[t] if preds[p] != neg else n + 1
            continue
        want = wanted_for(order)
        if not want:
            n += 1
            continue
        want = {want} if isinstance(want, str | int) else set(want)
        succ = kernel.successors(n)
        good = [s for s in succ if want & ({"exit"} if s == "exit" else kernel.first_events(s))]
        n = good[0] if good else n + 1
    info = {"tile_loops": [[hex(a), trips[a]] for a in order], "instructions": len(path),
            "truncated": steps >= max_steps, "load_loops_walked_once": [hex(a) for a in once],
            "load_loops": [[hex(a), sweep[a]] for a in sweep if sweep[a] is not None]}
    return path, order, info


def program_path(kernel: Kernel, work: list[float] | None, *, elements_per_byte: float, num_warps: int,
                 known_loads: dict | None = None, iterations: int = 1, loop_trips: tuple | None = None,
                 tail: float | None = None, max_steps: int = 2_000_000) -> tuple[list[Instr], dict]:
    """The instructions one program issues (see the module's comment). ``work``: the elements the
    program stores through each tile loop, in the order the program reaches them (None: each tile
    loop once); ``elements_per_byte``: elements per stored byte (1 / x's bytes); ``known_loads``:
    ``{address: value}`` of scalar loads whose value the launch gives; ``iterations``: with ``work``
    None, the iterations of every tile loop; ``loop_trips``: with ``work``, the iterations the
    launch gives of the program's loops in first-reach order (see ``_walk``: a norm's sweep over a
    token's heads); ``tail``: the elements the program stores after its tile loops, outside any
    (the head groups' peeled last batch: a predicated exit before those stores is not taken
    until they are done). Also returns what it did: the tile loops entered with their iterations,
    the load loops run their given trips, the instruction count.

    First a walk with every tile loop once and unknown branches not taken gives the tile loops in
    the order a program reaches them; the second walk runs each its iterations and, at an unknown
    branch, goes the way that reaches the next loop with work (else an exit)."""
    known_loads = known_loads or {}
    # at a branch the launch does not decide, the way on towards a tile loop not yet entered (else
    # the fall-through): a norm's backward whose head loop sits behind "more than one batch left"
    # was walked past its loop (ptxas put the skip on the fall-through), the program a tenth of its work
    path, order, info = _walk(kernel, lambda loop: iterations, lambda entered: set(kernel.tile_loops) - set(entered),
                              known_loads, max_steps)
    if work is None:
        return path, info

    def trips_for(loop):
        k = order.index(loop.start) if loop.start in order else len(work)
        if k >= len(work):
            return 1
        per_iter = loop.store_bytes * num_warps * elements_per_byte
        return max(1, math.ceil(work[k] / per_iter - 1e-9)) if per_iter else 1

    def wanted_for(entered):
        k = max((order.index(a) + 1 for a in entered if a in order), default=0)
        for j in range(k, min(len(work), len(order))):
            if work[j] > 0:
                return order[j]
        return "exit"

    path, _, info = _walk(kernel, trips_for, wanted_for, known_loads, max_steps, loop_trips,
                          (tail or 0.0) / elements_per_byte / num_warps)
    info["order"] = [hex(a) for a in order]
    return path, info


# --- what each instruction reads and writes: taint along the path --------------------------------

_CTAID, _TID, _LOADED = 1, 2, 4
_SLOT0 = 3  # bit of constant-bank slot 0 (4 bytes) of the kernel's parameters
_VIA = 512  # the taint that came through a loaded value sits this many bits up
_LOW = (1 << _VIA) - 1
_OPND = re.compile(r"(?<![A-Za-z0-9_])(UR|R|UP|P)(\d+)(\.64)?")
_CONST = re.compile(r"c\[0x0\]\[(0x[0-9a-f]+)\]")
_NO_DEST = {"STG", "STS", "ST", "STL", "STSM", "BRA", "EXIT", "BAR", "DEPBAR", "RED", "REDG", "MEMBAR", "NOP",
            "WARPSYNC", "BSSY", "BSYNC", "CALL", "RET", "LDGDEPBAR", "ERRBAR", "CCTL", "YIELD", "BPT", "SYNCS",
            "UTMALDG", "UTMASTG", "UBLKCP", "FENCE", "ELECT", "LDGSTS", "BMOV", "JMP", "BREAK", "KILL"}


@dataclasses.dataclass(frozen=True, eq=False)
class Params:
    """Where the kernel's parameters sit in constant bank 0: ``slots`` maps a 4-byte slot (its
    offset from the first parameter, / 4) to the parameter's name; ``pointers`` the names of the
    pointer parameters; ``base`` the bank offset of the first parameter (0x210 on sm_90)."""

    base: int
    slots: dict
    pointers: frozenset

    @classmethod
    def layout(cls, params: list[tuple[str, str]], base: int) -> "Params":
        """From the runtime parameters in order, (name, Triton type), constexprs left out: each
        aligned to its size (pointers and 64-bit values 8 bytes, the rest 4)."""
        slots, offset = {}, 0
        for name, ty in params:
            size = 8 if ty.startswith("*") or ty in ("i64", "u64", "fp64") else 4
            offset = -(-offset // size) * size
            for k in range(size // 4):
                slots[offset // 4 + k] = name
            offset += size
        return cls(base, slots, frozenset(n for n, ty in params if ty.startswith("*")))


PARAM_BASE = {80: 0x160, 86: 0x160, 89: 0x160, 90: 0x210}  # sm_100/120: not read here (no names)


def _dest_count(ins: Instr) -> int:
    parts = ins.opcode.split(".")
    if ins.base in ("HMMA", "IMMA", "HGMMA"):
        return 4
    if ins.base == "LDSM":
        return next((int(p[1:]) for p in parts if p in ("x1", "x2", "x4")), 1)
    if "128" in parts:
        return 4
    if "64" in parts or "WIDE" in parts or ins.base == "CS2R":
        return 2
    return 1


@dataclasses.dataclass(frozen=True)
class _Op:
    """One static instruction, read once: its dests, its sources, its memory operand's registers."""

    dests: tuple
    sources: tuple
    consts: tuple
    address: tuple  # registers of the memory operand ([...] and desc[...])
    special: int  # taint of S2R/S2UR


def _regs(text: str, wide_last: bool = False) -> list[str]:
    out = []
    for kind, num, wide in _OPND.findall(text):
        out.append(f"{kind}{num}")
        if wide and kind in ("R", "UR"):
            out.append(f"{kind}{int(num) + 1}")
    return out


def _read_op(ins: Instr) -> _Op:
    return _read_text(ins.opcode, ins.operands)


@functools.lru_cache(maxsize=1 << 16)
def _read_text(opcode: str, operands: str) -> _Op:
    """``_read_op`` of an instruction's text: the same text, in another path or kernel, is read
    once (the model reads each path's instructions several times)."""
    ins = Instr(0, "", opcode, operands)
    tokens = [t.strip() for t in ins.operands.split(",")] if ins.operands else []
    dests, sources, address = [], [], []
    rest = tokens
    if ins.base not in _NO_DEST and tokens:
        first = _OPND.match(tokens[0])
        if first and "[" not in tokens[0]:
            n = _dest_count(ins) if first.group(1) in ("R", "UR") else 1
            dests = [f"{first.group(1)}{int(first.group(2)) + k}" for k in range(n)]
            rest = tokens[1:]
            while rest and re.fullmatch(r"U?P(\d|T)", rest[0]):  # carry / second predicate outs
                if rest[0][-1] != "T":
                    dests.append(rest[0])
                rest = rest[1:]
    for t in rest:
        if "[" in t:
            address += _regs(t)
        sources += _regs(t)
    if "WIDE" in ins.opcode.split(".") and rest and re.fullmatch(r"U?R\d+", rest[-1]):
        last = rest[-1]  # the 64-bit addend
        sources.append(re.sub(r"\d+$", lambda m: str(int(m.group()) + 1), last))
    special = 0
    if ins.base in ("S2R", "S2UR", "CS2R"):
        special = _CTAID if "CTAID" in ins.operands else _TID if ("TID" in ins.operands or "LANEID" in ins.operands) else 0
    consts = [int(c, 16) for c in _CONST.findall(ins.operands)]
    return _Op(tuple(dests), tuple(sources), tuple(consts), tuple(address), special)


@dataclasses.dataclass
class LoadInfo:
    kind: str  # "dram" (a round trip, its bytes distinct), "hit" (lines another load brings: done when
    # they are in),
    # "l2" (an L2 hit: read by every program, or read again after too much else), "l1" (read again)
    pointers: tuple  # the pointer parameters its address is formed from (not through loaded values)
    gathered: bool  # its address depends on a loaded value
    distinct_bytes: int  # per warp
    wavefronts: int


_INDEXED = re.compile(r"c\[0x0\]\[(U?R\d+)\s*\+\s*(0x[0-9a-f]+)\]")
_IMM = r"(-?(?:0x[0-9a-f]+|\d+))"


@functools.lru_cache(maxsize=1 << 16)
def _immediate_form(opcode: str, operands: str) -> tuple | None:
    """What an instruction's text writes to its first register where it is a constant the path
    can name: a move of an immediate (``MOV``, ``UMOV``, ``IMAD.MOV.U32 Rd, RZ, RZ, imm``, or the
    ``HFMA2.MMA Rd, -RZ, RZ, hi, lo`` that writes two fp16 halves) as (value,), or a ``SEL``/``USEL``
    of two immediates or registers as its two items (ints, or register names); else None. Read
    once per text (the walk meets each text many times)."""
    tokens = [t.strip() for t in operands.split(",")]
    op = opcode.split(".")[0]
    imm = lambda t: re.fullmatch(_IMM, t) is not None
    if op in ("MOV", "UMOV") and len(tokens) == 2 and imm(tokens[1]):
        return (int(tokens[1], 0) & 0xFFFFFFFF,)
    if opcode == "IMAD.MOV.U32" and len(tokens) == 4 and tokens[1:3] == ["RZ", "RZ"] and imm(tokens[3]):
        return (int(tokens[3], 0) & 0xFFFFFFFF,)
    if opcode == "HFMA2.MMA" and len(tokens) == 5 and tokens[1] in ("-RZ", "RZ") and tokens[2] == "RZ":
        try:
            hi, lo = (int.from_bytes(struct.pack("<e", float(v)), "little") for v in tokens[3:5])
        except (ValueError, OverflowError, struct.error):
            return None
        return (hi << 16 | lo,)
    if op in ("SEL", "USEL") and len(tokens) == 4:
        return tuple(int(t, 0) & 0xFFFFFFFF if imm(t) else t for t in tokens[1:3])
    return None


def _immediates(ins: Instr, known: dict) -> frozenset | None:
    """The values an instruction may write to its first register (``_immediate_form``, a
    register's from ``known``: the registers holding one of a few constants), or None. (Triton
    3.9 selects q's or k's pointer by such an offset into the parameters: ``LDC.64 Rd,
    c[0x0][Rn+0x210]``, ``ULDC.64 URd, c[0x0][URn+0x210]``.)"""
    form = _immediate_form(ins.opcode, ins.operands)
    if form is None:
        return None
    vals = set()
    for item in form:
        if isinstance(item, int):
            vals.add(item)
        elif item in known:
            vals |= known[item]
        else:
            return None
    return frozenset(vals)


def taint_path(path: list[Instr], params: Params | None) -> dict[int, tuple]:
    """Position in ``path`` -> (address taint, pointers) of every global load and store. A
    constant read at a register offset (``c[0x0][Rn+off]``) reads the parameter slots of the
    values ``Rn`` may hold where they are immediates the path moved or selected (``_immediates``)."""
    ops: dict[int, _Op] = {}
    taint: dict[str, int] = {}
    known: dict[str, frozenset] = {}  # registers holding one of a few constants
    shared = 0  # what was stored to shared memory (a layout conversion passes loaded values through it)
    out = {}
    base = params.base if params else None
    for pos, ins in enumerate(path):
        op = ops.get(id(ins))
        if op is None:
            op = ops[id(ins)] = _read_op(ins)
        t = op.special
        for r in op.sources:
            t |= taint.get(r, 0)
        slots = 0  # the kernel-argument slots the instruction's constants read
        if base is not None:
            consts = list(op.consts)
            if "c[0x0][" in ins.operands:
                for reg, off in _INDEXED.findall(ins.operands):
                    consts += [v + int(off, 16) for v in known.get(reg, ())]
            for c in consts:
                if c >= base:
                    slots |= 1 << (_SLOT0 + (c - base) // 4)
        if op.dests:
            vals = _immediates(ins, known)
            guard = ins.pred and ins.pred != "@PT"
            d0 = op.dests[0]
            if vals is not None and guard and d0 in known:
                vals = vals | known[d0]  # (a predicated write: the old value or the new)
            elif vals is not None and guard:
                vals = None
            for d in op.dests:
                known.pop(d, None)
            if vals is not None:
                known[d0] = vals
        t |= slots
        if ins.base in GLOBAL or ins.base in ("LDG", "LD", "LDS", "LDSM"):
            a = slots
            for r in op.address:
                a |= taint.get(r, 0)
            out[pos] = a
            if ins.base in ("LDG", "LD", "LDGSTS"):
                t = _LOADED | (((a & _LOW) | (a >> _VIA)) << _VIA)
            elif ins.base in ("LDS", "LDSM"):
                t |= shared
        if ins.base in ("STS", "STSM"):
            for r in op.sources:
                if r not in op.address:
                    shared |= taint.get(r, 0)
        for d in op.dests:
            taint[d] = t
    return out


def _pointers(a: int, params: Params | None) -> tuple:
    if params is None:
        return ()
    names = []
    for slot, name in params.slots.items():
        if name in params.pointers and a >> (_SLOT0 + slot) & 1 and name not in names:
            names.append(name)
    return tuple(names)


_FRESH = ("LDG", "LD", "LDS", "LDSM", "LDL", "LDGSTS", "ATOM", "ATOMG", "ATOMS", "RED", "REDG")


def reread_distance(path: list[Instr]) -> dict[int, int]:
    """Position in ``path`` -> the bytes a warp loaded in between, for each global load that reads
    again an address an earlier load read (e.g. a loop-invariant weight read each trip, or twice
    in one). The address is compared by value numbering along the path: each register's value is
    named by the instruction that made it and the names of its sources (a
    recomputation from the same program id and parameters is the same value); what a load returns
    is a new value each time; a predicated write mixes in the predicate and the old value."""
    ops: dict[int, _Op] = {}
    names: dict = {}
    value: dict[str, int] = {}
    seen: dict = {}
    loaded = 0  # a warp's bytes of global loads so far (distinct addresses or not)
    out = {}
    for pos, ins in enumerate(path):
        op = ops.get(id(ins))
        if op is None:
            op = ops[id(ins)] = _read_op(ins)
        if ins.base in ("LDG", "LDGSTS"):
            mem = next((t for t in ins.operands.split(",") if "[" in t), "")
            key = (_OPND.sub("r", mem), tuple(value.get(r, r) for r in op.address))
            if key in seen:
                out[pos] = loaded - seen[key]
            loaded += access_bits(ins) * 32 // 8
            seen[key] = loaded
        if not op.dests:
            continue
        guard = ins.pred.lstrip("@") if ins.pred and ins.pred != "@PT" else ""
        if ins.base in _FRESH or "CLOCK" in ins.operands:
            base = ("new", pos)
        else:
            base = (ins.opcode, _OPND.sub("r", ins.operands), tuple(value.get(r, r) for r in op.sources))
        for k, d in enumerate(op.dests):
            key = (base, k, value.get(guard.lstrip("!"), guard), guard[:1] == "!", value.get(d, d)) if guard \
                else (base, k)
            value[d] = names.setdefault(key, len(names))
    return out


def classify(path: list[Instr], params: Params | None, l1_bytes: int | None = None) -> dict[int, LoadInfo]:
    """Position in ``path`` -> ``LoadInfo`` of every global load (see the module's comment).
    ``l1_bytes``: what a warp may load between two reads of one address for the second to hit L1
    (its share of the SM's L1); a re-read further apart is an L2 hit (None: always L1)."""
    addr = taint_path(path, params)
    again = reread_distance(path)
    first = {}
    direct_widest: dict[str, int] = {}
    for pos, a in addr.items():
        ins = path[pos]
        if ins.base not in ("LDG", "LDGSTS"):
            continue
        low, via = a & _LOW, a >> _VIA
        ptrs = _pointers(low, params)
        gathered = bool(low & _LOADED)
        per_program = bool((low | via) & _CTAID)
        first[pos] = (ptrs, gathered, per_program)
        if per_program and not gathered:
            for p in ptrs:
                direct_widest[p] = max(direct_widest.get(p, 0), wavefronts(access_bits(ins)))
    out = {}
    for pos, (ptrs, gathered, per_program) in first.items():
        ins = path[pos]
        bits = access_bits(ins)
        wf = wavefronts(bits)
        if pos in again:
            kind = "l1" if l1_bytes is None or again[pos] <= l1_bytes else "l2"
        elif not per_program:
            kind = "l2"
        elif gathered and any(p in direct_widest for p in ptrs):
            kind = "hit"
            wf = max(wf, max(direct_widest[p] for p in ptrs if p in direct_widest))
        else:
            kind = "dram"
        out[pos] = LoadInfo(kind, ptrs, gathered, bits * 32 // 8 if kind == "dram" else 0, wf)
    return out


def known_loads(kernel: Kernel, params: Params | None, uniform: dict | None) -> dict[int, int]:
    """``{address: value}`` of the scalar loads (one address for every thread and program, from a
    single pointer parameter) whose value the launch gives in ``uniform`` ({pointer name: value}),
    found on the walk with every tile loop once."""
    if not uniform or params is None:
        return {}
    path, _, _ = _walk(kernel, lambda loop: 1, lambda entered: None, {}, 200_000)
    out = {}
    for pos, a in taint_path(path, params).items():
        ins = path[pos]
        if ins.base != "LDG" or (a & (_CTAID | _TID | _LOADED)) or (a >> _VIA):
            continue
        ptrs = _pointers(a, params)
        if len(ptrs) == 1 and ptrs[0] in uniform:
            out[ins.addr] = uniform[ptrs[0]]
    return out


# --- the SM ----------------------------------------------------------------------------------

# what one dynamic instruction does in the schedule, as a tuple (fast to read in the loop):
# (stall, wait mask, write sb, read sb, kind, latency class, L1 wavefronts, distinct DRAM bytes, depbar,
# lines): lines, of a global load that reads DRAM or hits its lines ("hit"), the pointers it reads
# through (a direct load brings their lines, a "hit" waits for what the warp's last one brings)
_K_ALU, _K_MEM, _K_STORE, _K_BAR, _K_EXIT, _K_VAR, _K_ASYNC, _K_COMMIT = 0, 1, 2, 3, 4, 5, 6, 7


def _steps(path: list[Instr], controls: dict, loads: dict[int, LoadInfo]) -> list[tuple]:
    out = []
    for pos, ins in enumerate(path):
        c = controls.get(ins.addr) or {}
        stall, wait = max(1, c.get("stall", 1)), c.get("wait", 0)
        wsb, rsb = c.get("write"), c.get("read")
        base = ins.base
        kind, lat, wf, dram, dep, lines = _K_ALU, 0, 0, 0, None, None
        if base == "DEPBAR":
            m = re.search(r"SB(\d)\s*,\s*(0x[0-9a-f]+|\d+)", ins.operands)
            dep = (int(m.group(1)), int(m.group(2), 0)) if m else None
        if base in ("LDG", "LDGSTS"):
            info = loads.get(pos)
            kind = _K_ASYNC if base == "LDGSTS" else _K_MEM
            lat = info.kind if info is not None and info.kind in ("l2", "l1", "hit") else "dram"
            wf = info.wavefronts if info else wavefronts(access_bits(ins))
            dram = info.distinct_bytes if info else access_bits(ins) * 4
            lines = info.pointers or None if info is not None and info.kind in ("dram", "hit") else None
        elif base == "STG" or base in ("STS", "STSM"):
            kind, wf = _K_STORE, wavefronts(access_bits(ins))
        elif base in ("LDS", "LDSM"):
            kind, lat, wf = _K_MEM, "l1", wavefronts(access_bits(ins))
        elif base == "BAR" and ins.opcode not in ("BAR.ARV",):
            kind = _K_BAR
        elif base == "EXIT" and ins.pred in ("", "@PT"):
            kind = _K_EXIT
        elif base == "LDGDEPBAR":
            kind = _K_COMMIT
        elif wsb is not None or rsb is not None:
            kind = _K_VAR
            lat = ("const" if base in ("LDC", "ULDC") else "special" if base in ("S2R", "S2UR", "CS2R")
                   else "shfl" if base == "SHFL" else "mufu")
        out.append((stall, wait, wsb, rsb, kind, lat, wf, dram, dep, lines))
    if not out or out[-1][4] != _K_EXIT:
        out.append((1, 0, None, None, _K_EXIT, 0, 0, 0, None, None))
    return out


class _Warp:
    __slots__ = ("steps", "pc", "ready", "sb", "last", "groups", "open", "slot", "barrier", "program", "sched",
                 "brought")

    def __init__(self, steps, slot, start, program):
        self.steps, self.pc, self.ready, self.slot, self.program = steps, 0, start, slot, program
        self.sb = [[] for _ in range(6)]  # pending completions a DEPBAR counts (kept where one does)
        self.last = [0.0] * 6  # the last completion on each scoreboard: a wait mask waits for it
        self.groups, self.open, self.barrier = [], [], 0
        self.brought = {}  # pointer -> when the warp's last direct DRAM load through it completes


_BITS = [[k for k in range(6) if m >> k & 1] for m in range(64)]


def _earliest(w: _Warp) -> float:
    """When ``w``'s next instruction may issue (its stall and the scoreboards it waits on)."""
    step = w.steps[w.pc]
    t = w.ready
    wait = step[1]
    if wait:
        last = w.last
        for k in _BITS[wait]:
            if last[k] > t:
                t = last[k]
    dep = step[8]
    if dep is not None:
        k, keep = dep
        times = sorted(w.sb[k])
        if len(times) > keep:
            t = max(t, times[len(times) - keep - 1])
        if k == 0 and len(w.groups) > keep:
            t = max(t, sorted(w.groups)[len(w.groups) - keep - 1])
    return t


def simulate(programs: list[list[tuple]], *, ctas_per_sm: int, num_warps: int, dram_cycles: float,
             latency: dict = LATENCY, trace: list | None = None) -> dict:
    """The busiest SM running ``programs`` (each the ``_steps`` of one program, in dispatch order)
    over ``ctas_per_sm`` slots (see the module's comment): every warp, on four schedulers (warp
    ``slot * num_warps + w`` on scheduler ``% 4``), one L1 path. Returns the cycles to the last
    exit and what was busy. ``trace``: a list to append each warp's global loads to, as (program,
    slot, step index, issue clock, completion clock, latency class): a program's critical path."""
    ctas = max(1, ctas_per_sm)
    lat = dict(latency)
    lat["dram"] = dram_cycles
    queue = list(range(len(programs)))
    queue.reverse()
    heap, seq = [], 0
    live = [0] * ctas
    arrived: dict = {}
    sched_free = [0.0] * 4
    l1_free = 0.0
    issued = l1_busy = inflight = dram_bytes = 0.0
    end = 0.0
    scheds = [[(s * num_warps + w) % 4 for w in range(num_warps)] for s in range(ctas)]
    operands = latency["operands"]
    # the scoreboards some DEPBAR counts (their pending completions kept as lists)
    distinct = {id(p): p for p in programs}.values()
    counted = [any(st[8] is not None and st[8][0] == k for prog in distinct for st in prog) for k in range(6)]

    def start(slot, t):
        nonlocal seq
        if not queue:
            return
        p = queue.pop()
        for w in range(num_warps):
            warp = _Warp(programs[p], slot, t, p)
            warp.sched = scheds[slot][w]
            heapq.heappush(heap, (t, seq, warp))
            seq += 1
        live[slot] = num_warps

    for s in range(ctas):
        start(s, 0.0)
    while heap:
        e, _, w = heapq.heappop(heap)
        sc = w.sched
        if sched_free[sc] > e:  # its scheduler issued this clock: the next one
            heapq.heappush(heap, (sched_free[sc], seq, w))
            seq += 1
            continue
        t = e
        sched_free[sc] = t + 1
        issued += 1
        stall, wait, wsb, rsb, kind, lt, wf, dram, dep, lines = w.steps[w.pc]
        if dep is not None or kind == _K_COMMIT:  # forget what completed, where a DEPBAR counts
            for k in range(6):
                if w.sb[k]:
                    w.sb[k] = [x for x in w.sb[k] if x > t]
            if w.groups:
                w.groups = [x for x in w.groups if x > t]
        w.ready = t + stall
        last = w.last
        if kind == _K_ALU:
            pass
        elif kind <= _K_STORE or kind == _K_ASYNC:
            if True:
                s0 = l1_free if l1_free > t else t
                l1_free = s0 + wf
                l1_busy += wf
                if rsb is not None:
                    x = s0 + operands
                    if x > last[rsb]:
                        last[rsb] = x
                    if counted[rsb]:
                        w.sb[rsb].append(x)
                if kind != _K_STORE:
                    if lt == "hit":  # lines a direct load brings: when they are in, or an L1 hit
                        came = max((w.brought.get(p, 0.0) for p in lines), default=0.0) if lines else 0.0
                        done_at = max(s0 + lat["l1"], came) if came else s0 + lat["dram"]
                    else:
                        done_at = s0 + lat[lt]
                        if lines and lt == "dram":
                            for p in lines:
                                w.brought[p] = done_at
                    if trace is not None and lt in ("dram", "l2", "hit"):
                        trace.append((w.program, w.slot, w.pc, t, done_at, lt))
                    if dram:
                        inflight += dram * (done_at - s0)
                        dram_bytes += dram
                    if kind == _K_ASYNC:
                        w.open.append(done_at)
                    elif wsb is not None:
                        if done_at > last[wsb]:
                            last[wsb] = done_at
                        if counted[wsb]:
                            w.sb[wsb].append(done_at)
        elif kind == _K_VAR:
            if wsb is not None:
                x = t + lat[lt]
                if x > last[wsb]:
                    last[wsb] = x
                if counted[wsb]:
                    w.sb[wsb].append(x)
            if rsb is not None:
                x = t + 5
                if x > last[rsb]:
                    last[rsb] = x
                if counted[rsb]:
                    w.sb[rsb].append(x)
        elif kind == _K_COMMIT:
            w.groups.append(max(w.open) if w.open else t)
            w.open = []
        elif kind == _K_EXIT:
            end = max(end, t)
            live[w.slot] -= 1
            if live[w.slot] == 0:
                start(w.slot, t + 1)
            continue
        w.pc += 1
        if kind == _K_BAR:
            key = (w.slot, w.program, w.barrier)
            w.barrier += 1
            group = arrived.setdefault(key, [])
            group.append(w)
            if len(group) < num_warps:
                continue  # waits for the CTA's other warps
            go = max(x.ready for x in group) + latency["barrier"]
            for x in group:
                x.ready = max(x.ready, go)
                heapq.heappush(heap, (_earliest(x), seq, x))
                seq += 1
            del arrived[key]
            continue
        heapq.heappush(heap, (_earliest(w), seq, w))
        seq += 1
    return {"cycles": end, "issue_busy": issued / 4 / end if end else 0.0,
            "l1_busy": l1_busy / end if end else 0.0, "programs": len(programs),
            "inflight_bytes_per_sm": inflight / end if end else 0.0, "dram_bytes_per_sm": dram_bytes}


# --- a launch ---------------------------------------------------------------------------------

CLOCKS_GHZ = (1.755, 1.98)  # the sustained clock the issue names (worst end), and H100/H200's boost
LATENCIES_NS = (600.0, 800.0)  # a DRAM round trip, idle to loaded (microbenchmarks)


@dataclasses.dataclass(frozen=True)
class Programs:
    """A launch's programs: ``kinds`` as (count, work), (count, work, loop_trips) or (count, work,
    loop_trips, tail) in dispatch order (work: the elements each tile loop stores, in the order a
    program reaches them; None: each tile loop once; loop_trips, tail: ``program_path``'s; None
    where not given), ``grid`` the programs in all,
    ``uniform`` {pointer name: value} of the scalar loads the launch gives."""

    kinds: tuple
    grid: int
    uniform: tuple = ()
    iterations: int | None = None  # where work is None: every tile loop this many times (a steady tile)

    def busiest(self, sms: int) -> list[int]:
        """Kind indices of the programs SM 0 runs: ceil(grid / SMs) of them, every SMs-th in
        dispatch order (the block scheduler hands programs out in order)."""
        return self.on_sm(0, sms)

    def on_sm(self, sm: int, sms: int) -> list[int]:
        """Kind indices of the programs SM ``sm`` runs: programs sm, sm + SMs, ... in dispatch order."""
        bounds, acc = [], 0
        for n, *_ in self.kinds:
            acc += n
            bounds.append(acc)
        out, k = [], 0
        for i in range(sm, self.grid, max(1, sms)):
            while k < len(bounds) - 1 and i >= bounds[k]:
                k += 1
            out.append(k)
        return out

    def sm_sequences(self, sms: int, most: int = 12) -> list[list[int]]:
        """The SMs' distinct program sequences (``on_sm``; kinds of equal work and trips are one),
        at most ``most``: those with the most programs, then the most work, first. The launch ends
        when its slowest SM does: where every program is alike that is SM 0's, but a launch of few
        programs (a decode step: one program an SM) ends with its heaviest program, e.g. the head
        group that holds q's last heads and k's first (the q->k seam)."""
        seen = {}
        for sm in range(min(self.grid, max(1, sms))):
            seq = self.on_sm(sm, sms)
            seen.setdefault(tuple(tuple(self.kinds[k][1:]) for k in seq), seq)

        def work(key):
            return sum(x for w, *_ in key for x in (w or ()) if x)
        ranked = sorted(seen, key=lambda key: (-len(key), -work(key)))
        return [seen[key] for key in ranked[:most]]


_CACHE: dict = {}


def schedule_launch(sass: str, programs: Programs, *, params: Params | None, ctas_per_sm: int, num_warps: int,
                    l1_bytes: int | None = None,
                    x_bytes: float, dram_bytes_per_element: float, launch_elements: float | None = None,
                    sms: int = 132, clocks_ghz=CLOCKS_GHZ, latencies_ns=LATENCIES_NS) -> dict:
    """The launch on its slowest SM (``Programs.sm_sequences``) at each DRAM latency and clock:
    ``ends`` {"800ns@1.755GHz": {us, gbps, ...}}, and per program kind its path (tile loops and
    iterations, instructions, L1 wavefronts, the elements it stores) and its global loads by class.
    The rate: the DRAM bytes of the launch (``launch_elements`` x ``dram_bytes_per_element``;
    without a launch, those of that SM's programs x SMs) over that SM's time."""
    key = (hash(sass), programs, (params.base, tuple(sorted(params.slots.items())), params.pointers) if params else None,
           ctas_per_sm, num_warps, l1_bytes, x_bytes, dram_bytes_per_element, launch_elements, sms, tuple(clocks_ghz),
           tuple(latencies_ns))
    if key in _CACHE:
        return _CACHE[key]
    kernel = Kernel(sass)
    known = known_loads(kernel, params, dict(programs.uniform))
    steps, paths = [], []
    for _, work, *given in programs.kinds:
        path, info = program_path(kernel, list(work) if work is not None else None, elements_per_byte=1 / x_bytes,
                                  num_warps=num_warps, known_loads=known, iterations=programs.iterations or 1,
                                  loop_trips=given[0] if given else None,
                                  tail=given[1] if len(given) > 1 else None)
        loads = classify(path, params, l1_bytes)
        # what the loops that load without storing read from DRAM (a first sweep over a token's
        # heads): the program reads those lines again (the sweep is there to be followed by it);
        # at the worst end the second read misses L2 too, so these are DRAM bytes the op's count
        # leaves out
        swept = sum(li.distinct_bytes for pos, li in loads.items() if li.kind == "dram"
                    and any(s <= path[pos].addr <= e for s, e in kernel.load_loops.items())) * num_warps
        st = _steps(path, kernel.controls, loads)
        steps.append(st)
        by = {}
        for li in loads.values():
            b = by.setdefault(li.kind, {"loads": 0, "wavefronts": 0, "distinct_bytes": 0})
            b["loads"] += 1
            b["wavefronts"] += li.wavefronts
            b["distinct_bytes"] += li.distinct_bytes
        stored = sum(access_bits(i) * 32 // 8 for i in path if i.base == "STG") * num_warps / x_bytes
        info |= {"loads": by, "wavefronts": sum(x[6] for x in st), "elements_stored": stored,
                 "swept_dram_bytes": swept,
                 "shared_accesses": sum(1 for i in path if i.base in SHARED),
                 "barriers": sum(1 for x in st if x[4] == _K_BAR)}
        paths.append(info)
    # the slowest SM's programs: each distinct sequence scheduled at the worst end, the slowest
    # one then at every end
    worst_lat, worst_clk = max(latencies_ns), min(clocks_ghz)
    sequences = programs.sm_sequences(sms)
    order, worst = sequences[0], None
    if len(sequences) > 1:  # (the slowest one's worst-end schedule kept for the ends below)
        runs = [(simulate([steps[k] for k in o], ctas_per_sm=ctas_per_sm, num_warps=num_warps,
                          dram_cycles=worst_lat * worst_clk), o) for o in sequences]
        worst, order = max(runs, key=lambda ro: ro[0]["cycles"])
    seq = [steps[k] for k in order]
    if launch_elements is None:
        launch_elements = sum(paths[k]["elements_stored"] for k in order) * sms
    dram_bytes = launch_elements * dram_bytes_per_element
    # the bytes read again (sweeps), as a share of the op's bytes on the busiest SM's programs
    own = sum(paths[k]["elements_stored"] for k in order) * dram_bytes_per_element
    reread = sum(paths[k]["swept_dram_bytes"] for k in order) / own if own else 0.0
    ends = {}
    for lat in latencies_ns:
        for clk in clocks_ghz:
            r = worst if worst is not None and (lat, clk) == (worst_lat, worst_clk) else \
                simulate(seq, ctas_per_sm=ctas_per_sm, num_warps=num_warps, dram_cycles=lat * clk)
            us = r["cycles"] / clk / 1e3
            ends[end_name(lat, clk)] = {
                "latency_ns": lat, "clock_ghz": clk, "us": us, "gbps": dram_bytes / (us * 1e3) if us else math.inf,
                "issue_busy": r["issue_busy"], "l1_busy": r["l1_busy"],
                "inflight_kb_per_sm": r["inflight_bytes_per_sm"] / 1024}
    out = {"ends": ends, "paths": paths, "programs_on_busiest_sm": len(seq), "sm_kinds": order,
           "sm_sequences": len(sequences), "dram_bytes": dram_bytes,
           "reread_share": reread, "dram_bytes_moved": dram_bytes * (1 + reread),
           "known_loads": {hex(a): v for a, v in known.items()}}
    _CACHE[key] = out
    return out


def end_name(latency_ns: float, clock_ghz: float) -> str:
    return f"{latency_ns:.0f}ns@{clock_ghz:g}GHz"
