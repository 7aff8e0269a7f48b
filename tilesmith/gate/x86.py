"""x86-64 instruction lengths: which system-call instructions a library's code can execute, as opposed to the same two
bytes inside another instruction.

`0f 05` (syscall), `0f 34` (sysenter) and `cd 80` (int 0x80) occur by chance inside honest instructions: a RIP-relative
displacement (`48 8b 05 0f 34 00 00`, mov rax, [rip + 0x340f]), an immediate, a constant. Counted at every byte offset,
they rejected honest kernels (a tuner's variant of a decoder's SiLU kernel: 4 KB of code, one such displacement). So
the code is decoded from every place execution can enter it by a route its bytes spell out, and only instructions
the decoding reaches count:

- the start of each executable segment, every address the library names (its defined symbols, every relocation's
  target and addend, DT_INIT/DT_FINI), and, found while decoding, every direct branch's target and every RIP-relative
  operand's address that lands in code (`lea rdi, [rip + fn]` is how a function pointer is made);
- from each such start, one instruction after another (past jumps and returns too, since a jump table's cases follow
  their switch) until the decoding meets an instruction already decoded or leaves the segment;
- where this decoder does not know an instruction's length for certain (an opcode it does not know, one this CPU
  would refuse but another might not, APX's REX2 and EVEX maps 4 and 7, encodings whose length differs between Intel
  and AMD: an operand-size prefix on a near branch, SSE4a's EXTRQ/INSERTQ), every possible next instruction (the
  next 15 bytes, and each vendor's length) is decoded too.

So a system-call instruction hidden inside another one is still found when a direct branch, a fall-through or a
RIP-relative address reaches it. What is not followed: an address computed at run time by arithmetic (a PIC jump
table's relative entries, a pointer into libc plus an offset): such code can reach a system-call instruction anyway
(libc holds many), and allowlist_native's docstring says that no static check of machine code rules it out. Against
this decoder's own mistakes: tests/test_gate_x86.py compares every length with objdump's over real libraries.
"""

from __future__ import annotations

MAX_LEN = 15
_LEGACY = frozenset({0xF0, 0xF2, 0xF3, 0x2E, 0x36, 0x3E, 0x26, 0x64, 0x65, 0x66, 0x67})

# Operands after the one-byte opcode: m = ModRM (and SIB, displacement), b/w = 8/16-bit immediate, z = 16 or 32 bits
# by operand size, v = 16/32/64 (mov reg, imm), a = a 32/64-bit absolute address (by address size), e = enter's 3
# bytes, j = rel8 branch, J = rel32 branch, g = the F6/F7 group (an immediate for /0 and /1), X = invalid in 64-bit
# mode, 0 = none. Prefixes and escapes (0F, VEX, EVEX, XOP, REX, REX2) are read before the table.
_MAP0 = (
    "m m m m b z X X m m m m b z X -"  # 00-0F
    " m m m m b z X X m m m m b z X X"  # 10-1F
    " m m m m b z - X m m m m b z - X"  # 20-2F
    " m m m m b z - X m m m m b z - X"  # 30-3F
    " - - - - - - - - - - - - - - - -"  # 40-4F: REX
    " 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0"  # 50-5F
    " X X - m - - - - z mz b mb 0 0 0 0"  # 60-6F
    " j j j j j j j j j j j j j j j j"  # 70-7F
    " mb mz X mb m m m m m m m m m m m m"  # 80-8F (8F: pop r/m, or XOP)
    " 0 0 0 0 0 0 0 0 0 0 X 0 0 0 0 0"  # 90-9F
    " a a a a 0 0 0 0 b z 0 0 0 0 0 0"  # A0-AF
    " b b b b b b b b v v v v v v v v"  # B0-BF
    " mb mb w 0 - - mb mz e 0 w 0 0 b X 0"  # C0-CF
    " m m m m X - X 0 m m m m m m m m"  # D0-DF (D5: REX2)
    " j j j j b b b b J J X j 0 0 0 0"  # E0-EF
    " - 0 - - 0 0 g g 0 0 0 0 0 0 m m"  # F0-FF
).split()
# The 0F map: the same letters.
_MAP1 = (
    "m m m m X 0 0 0 0 0 X 0 X m 0 mb"  # 00-0F (05 syscall, 0B ud2, 0F 3DNow!)
    " m m m m m m m m m m m m m m m m"  # 10-1F
    " m m m m X X X X m m m m m m m m"  # 20-2F
    " 0 0 0 0 0 0 X 0 - X - X X X X X"  # 30-3F (34 sysenter; 38, 3A: three-byte maps)
    " m m m m m m m m m m m m m m m m"  # 40-4F
    " m m m m m m m m m m m m m m m m"  # 50-5F
    " m m m m m m m m m m m m m m m m"  # 60-6F
    " mb mb mb mb m m m 0 m m X X m m m m"  # 70-7F
    " J J J J J J J J J J J J J J J J"  # 80-8F
    " m m m m m m m m m m m m m m m m"  # 90-9F
    " 0 0 0 m mb m X X 0 0 0 m mb m m m"  # A0-AF
    " m m m m m m m m m m mb m m m m m"  # B0-BF
    " m m mb m mb mb mb m 0 0 0 0 0 0 0 0"  # C0-CF
    " m m m m m m m m m m m m m m m m"  # D0-DF
    " m m m m m m m m m m m m m m m m"  # E0-EF
    " m m m m m m m m m m m m m m m m"  # F0-FF
).split()
assert len(_MAP0) == len(_MAP1) == 256
_VEX1_IMM8 = frozenset({0x70, 0x71, 0x72, 0x73, 0xC2, 0xC4, 0xC5, 0xC6})  # the 0F map's opcodes with an imm8 under VEX/EVEX

# What an instruction is, for the sweep. FAR: a far return, far call or far jump, or iret, which can change the code
# segment, and so the mode the CPU decodes in: 64-bit bytes that hold no system call can hold one read as 32-bit code
# (48 b8 .. cd 80: movabs to the CPU in 64-bit mode, `dec eax; ...; int 0x80` in compatibility mode). No compiler
# emits one in a function; each is refused as a system call is.
PLAIN, SYSCALL, UNSURE, FAR = 0, 1, 2, 3
_FAR_OPCODES = frozenset({0xCA, 0xCB, 0xCF})  # retf imm16, retf, iret (any operand size)


def _modrm_len(code: bytes, i: int) -> tuple[int, int | None]:
    """Length of the ModRM byte at i with its SIB and displacement, and the RIP-relative displacement's offset in the
    instruction's bytes (None if the operand is not RIP-relative). In 64-bit mode a 0x67 prefix keeps this format."""
    modrm = code[i]
    mod, rm = modrm >> 6, modrm & 7
    if mod == 3:
        return 1, None
    n = 1
    if rm == 4:
        sib = code[i + 1]
        n += 1
        if mod == 0 and sib & 7 == 5:
            return n + 4, None
    elif mod == 0 and rm == 5:
        return 5, 1  # [rip + disp32]
    return n + (1 if mod == 1 else 4 if mod == 2 else 0), None


def decode(code: bytes, i: int) -> tuple[int, int, list[int], list[int]]:
    """The instruction at code[i]: (length, kind, the offsets (relative to i) of other possible next instructions
    where a vendor's length differs or the length is unsure, the code offsets it names: a branch's target or a
    RIP-relative operand's address). Raises IndexError past the end of code."""
    start, op66 = i, False
    addr32 = rex_w = False
    while code[i] in _LEGACY or 0x40 <= code[i] <= 0x4F:
        b = code[i]
        op66 |= b == 0x66
        addr32 |= b == 0x67
        rex_w = 0x40 <= b <= 0x4F and bool(b & 8)  # a REX counts only right before the opcode
        i += 1
        if i - start >= MAX_LEN:
            return 1, UNSURE, list(range(1, MAX_LEN + 1)), []
    b = code[i]
    if b == 0xD5:  # REX2 (APX; invalid before it): a syscall in the 0F map (M0 set), else lengths not modelled
        if code[i + 1] & 0x80 and code[i + 2] in (0x05, 0x34):
            return i + 3 - start, SYSCALL, [], []
        return 1, UNSURE, list(range(1, MAX_LEN + 1)), []
    if b in (0xC4, 0xC5, 0x62) or (b == 0x8F and code[i + 1] & 0x1F >= 8):
        return _vex(code, start, i)
    i += 1
    if b == 0x0F:
        return _map1(code, start, i, op66, addr32, rex_w)
    if b == 0xCD:
        return i + 1 - start, SYSCALL if code[i] == 0x80 else PLAIN, [], []
    n, kind, alts, targets = _operands(code, start, i, _MAP0[b], op66, addr32, rex_w, b)
    if b in _FAR_OPCODES or (b == 0xFF and (code[i] >> 3) & 7 in (3, 5)):  # ff /3 call far, ff /5 jmp far
        kind = FAR
    return n, kind, alts, targets


def _operands(code, start, i, spec, op66, addr32, rex_w, opcode, twobyte=False):
    if spec == "X":
        return i - start, UNSURE, list(range(1, MAX_LEN + 1)), []
    z = 4 if rex_w or not op66 else 2
    targets, alts, rip = [], [], None
    if spec[0] == "m":
        modrm = code[i]
        n, rip = _modrm_len(code, i)
        i += n
        if rip is not None:
            rip = i - n + rip
        imm = spec[1:]
        if not twobyte and opcode == 0xC7 and modrm == 0xF8:  # xbegin rel: its abort path is a branch target
            end = i + z
            targets.append(end + int.from_bytes(code[i:end], "little", signed=True) - start)
        i += {"": 0, "b": 1, "z": z}[imm]
    elif spec == "g":  # F6/F7: test r/m, imm for /0 and /1
        modrm = code[i]
        n, rip = _modrm_len(code, i)
        rip = None if rip is None else i + rip
        i += n
        if (modrm >> 3) & 7 in (0, 1):
            i += 1 if opcode == 0xF6 else z
    elif spec in ("j", "J"):
        n = 1 if spec == "j" else 4
        end = i + n
        targets.append(end + int.from_bytes(code[i:end], "little", signed=True) - start)
        if spec == "J" and op66 and not rex_w:  # AMD honours 0x66 on a near branch (rel16), Intel ignores it
            alts.append(i + 2 - start)  # (its target, truncated to 16 bits, is no address of a library)
        i = end
    else:
        i += {"0": 0, "b": 1, "w": 2, "z": z, "v": 8 if rex_w else z, "a": 4 if addr32 else 8, "e": 3}[spec]
    if i > len(code):
        raise IndexError(i)
    if rip is not None:
        targets.append(i + int.from_bytes(code[rip:rip + 4], "little", signed=True) - start)
    return i - start, PLAIN, alts, targets


def _map1(code, start, i, op66, addr32, rex_w):
    b = code[i]
    i += 1
    if b == 0x38:
        return _operands(code, start, i + 1, "m", op66, addr32, rex_w, 0, True)
    if b == 0x3A:
        return _operands(code, start, i + 1, "mb", op66, addr32, rex_w, 0, True)
    if b in (0x05, 0x34):
        return i - start, SYSCALL, [], []
    n, kind, alts, targets = _operands(code, start, i, _MAP1[b], op66, addr32, rex_w, b, True)
    if b in (0x78, 0x79):  # VMREAD/VMWRITE on Intel; with 66 or F2, AMD's EXTRQ/INSERTQ (0x78 takes two imm8)
        alts = alts + [n + 2]
    return n, kind, alts, targets


def _vex(code, start, i):
    """VEX (C4, C5), EVEX (62) and XOP (8F): the map from the prefix, then opcode, ModRM, and an imm8 by map."""
    b = code[i]
    if b == 0xC5:
        mp, i = 1, i + 2
    elif b == 0xC4:
        mp, i = code[i + 1] & 0x1F, i + 3
        if mp not in (1, 2, 3):
            return i - start, UNSURE, list(range(1, MAX_LEN + 1)), []
    elif b == 0x62:
        mp, i = code[i + 1] & 7, i + 4
        if mp not in (1, 2, 3, 5, 6):  # 4 and 7: APX and AVX10.2 maps, lengths not modelled
            return i - start, UNSURE, list(range(1, MAX_LEN + 1)), []
    else:
        mp, i = code[i + 1] & 0x1F, i + 3
        if mp not in (8, 9, 10):
            return i - start, UNSURE, list(range(1, MAX_LEN + 1)), []
    op = code[i]
    i += 1
    if mp == 1 and op == 0x77 and b in (0xC4, 0xC5):  # vzeroupper / vzeroall: no ModRM
        return i - start, PLAIN, [], []
    n, rip = _modrm_len(code, i)
    rip = None if rip is None else i + rip
    i += n
    if mp in (3, 8) or (mp == 1 and op in _VEX1_IMM8):
        i += 1
    elif mp == 10:
        i += 4
    if i > len(code):
        raise IndexError(i)
    targets = [] if rip is None else [i + int.from_bytes(code[rip:rip + 4], "little", signed=True) - start]
    return i - start, PLAIN, [], targets


def system_calls(segments: list[tuple[int, bytes]], entries: list[int]) -> int:
    """System-call instructions reachable in `segments` ((vaddr, bytes) of each executable segment) from the segments'
    starts and `entries` (addresses the library names), by decoding as the module docstring says."""
    return reachable(segments, entries)[SYSCALL]


def reachable(segments: list[tuple[int, bytes]], entries: list[int]) -> dict[int, int]:
    """How many reachable instructions of each kind (SYSCALL, FAR, ...) `segments` hold (see system_calls)."""
    def segment_of(addr):
        for k, (base, code) in enumerate(segments):
            if base <= addr < base + len(code):
                return k
        return None

    seen = [set() for _ in segments]
    work = [base for base, _ in segments] + list(entries)
    found = {PLAIN: 0, SYSCALL: 0, UNSURE: 0, FAR: 0}
    while work:
        addr = work.pop()
        k = segment_of(addr)
        if k is None:
            continue
        base, code = segments[k]
        i = addr - base
        while 0 <= i < len(code) and i not in seen[k]:
            seen[k].add(i)
            try:
                n, kind, alts, targets = decode(code, i)
            except IndexError:
                break
            found[kind] += 1
            work.extend(base + i + t for t in targets)
            work.extend(base + i + a for a in alts)
            if kind == UNSURE:
                break  # every possible next instruction is in `alts`
            i += n
    return found
