"""The code addresses a library's unwind tables name: where the unwinder can send execution without a relocation or a
symbol saying so.

A C++ throw makes libgcc's unwinder find the frames' descriptions through the library's PT_GNU_EH_FRAME segment
(`.eh_frame_hdr`, then `.eh_frame`), call the personality routine a CIE names and jump to the landing pad the
function's LSDA (`.gcc_except_table`) names. A direct (pc-relative) personality pointer and a landing pad offset are
plain numbers in those tables: a red team put each inside another instruction's immediate, where the sweep of
gate/x86.py never decoded, and ran a raw system call with only `__cxa_throw` imported. So the sweep also starts at
every function start an FDE gives, every direct personality routine, and every landing pad, as the unwinder reads
them (DWARF's pointer encodings; the table's FDEs and the ones a walk of `.eh_frame` finds, since the unwinder may use
either). An indirect personality pointer names a slot that a relocation fills: the relocation's target is decoded from
already (allowlist_native._named_addresses).
"""

from __future__ import annotations

import struct

_OMIT = 0xFF
_MAX_RECORDS = 1 << 20


class EhError(ValueError):
    """The unwind tables cannot be read as the unwinder would read them."""


class _Mem:
    """The library's loaded bytes by address (its PT_LOAD segments' file bytes)."""

    def __init__(self, data: bytes, loads: list):
        self.data, self.loads = data, loads

    def off(self, addr: int) -> int:
        for v, off, filesz, _ in self.loads:
            if v <= addr < v + filesz:
                return off + addr - v
        raise EhError(f"address {addr:#x} is in no loaded segment")

    def u8(self, addr: int) -> int:
        return self.data[self.off(addr)]

    def unpack(self, fmt: str, addr: int):
        try:
            return struct.unpack_from(fmt, self.data, self.off(addr))[0]
        except struct.error:
            raise EhError(f"truncated at {addr:#x}") from None

    def uleb(self, addr: int) -> tuple[int, int]:
        val = shift = 0
        while True:
            b = self.u8(addr)
            addr += 1
            val |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return val, addr
            if shift > 70:
                raise EhError("uleb128 too long")

    def sleb(self, addr: int) -> tuple[int, int]:
        start = addr
        val, addr = self.uleb(addr)
        bits = 7 * (addr - start)
        return (val - (1 << bits) if val >> (bits - 1) & 1 else val), addr

    def cstr(self, addr: int) -> tuple[str, int]:
        o = self.off(addr)
        end = self.data.find(b"\0", o)
        if end < 0:
            raise EhError("unterminated string")
        return self.data[o:end].decode("latin-1"), addr + end - o + 1

    def encoded(self, enc: int, addr: int, data_base: int = 0, func_base: int = 0) -> tuple[int | None, int]:
        """A DWARF EH pointer at addr: (its value with the encoding's base applied, the address after it); the value
        is None for DW_EH_PE_omit. An indirect pointer's value is the address of its slot (the caller decides)."""
        if enc == _OMIT:
            return None, addr
        fmt = enc & 0x0F
        at = addr
        if fmt == 0x01:
            val, addr = self.uleb(addr)
        elif fmt == 0x09:
            val, addr = self.sleb(addr)
        else:
            spec = {0x00: "<Q", 0x02: "<H", 0x03: "<I", 0x04: "<Q", 0x0A: "<h", 0x0B: "<i", 0x0C: "<q"}.get(fmt)
            if spec is None:
                raise EhError(f"pointer encoding {enc:#x}")
            val = self.unpack(spec, addr)
            addr += struct.calcsize(spec)
        app = enc & 0x70
        if app == 0x10:
            val += at
        elif app == 0x30:
            val += data_base
        elif app == 0x40:
            val += func_base
        elif app not in (0x00,):
            raise EhError(f"pointer encoding {enc:#x}")
        return val & ((1 << 64) - 1), addr


def code_addresses(data: bytes, loads: list, hdr: int) -> list[int]:
    """Function starts, direct personality routines and landing pads named by the unwind tables whose
    `.eh_frame_hdr` is at address `hdr` (PT_GNU_EH_FRAME's). Raises EhError where they cannot be read."""
    m = _Mem(data, loads)
    version, ptr_enc, count_enc, table_enc = (m.u8(hdr + k) for k in range(4))
    if version != 1:
        raise EhError(f".eh_frame_hdr version {version}")
    eh_frame, at = m.encoded(ptr_enc, hdr + 4, hdr)
    fdes: set[int] = set()
    count, at = m.encoded(count_enc, at, hdr)
    if count is not None and table_enc != _OMIT:
        if count > _MAX_RECORDS:
            raise EhError("too many FDEs")
        for _ in range(count):
            _, at = m.encoded(table_enc, at, hdr)
            fde, at = m.encoded(table_enc, at, hdr)
            fdes.add(fde)
    cies: dict[int, dict] = {}
    table = set(fdes)
    if eh_frame is not None:  # the walk the unwinder makes without a table
        addr = eh_frame
        for _ in range(_MAX_RECORDS):
            try:
                length = m.unpack("<I", addr)
            except EhError:  # the segment ends: a library linked without crtend's terminator (libunwind's own)
                break
            if length == 0:
                break
            body = addr + (12 if length == 0xFFFFFFFF else 4)
            if length == 0xFFFFFFFF:
                length = m.unpack("<Q", addr + 4)
            if m.unpack("<I", body) != 0:
                fdes.add(addr)
            addr = body + length
    out = []
    for fde in sorted(fdes):
        try:
            out += _fde(m, fde, cies)
        except EhError:
            # Where a table names the FDEs the unwinder reads only those: the walk's records after a section that
            # lacks its terminator (gcc's libcc1: .gcc_except_table read on as records) are no FDEs to it.
            if fde in table or not table:
                raise
    return out


def _cie(m: _Mem, addr: int, cies: dict) -> dict:
    if addr in cies:
        return cies[addr]
    length = m.unpack("<I", addr)
    body = addr + 4
    if length == 0xFFFFFFFF:
        body += 8
    if m.unpack("<I", body) != 0:
        raise EhError(f"CIE at {addr:#x} is not one")
    version = m.u8(body + 4)
    aug, at = m.cstr(body + 5)
    if version == 4:
        at += 2  # address size, segment selector size
    _, at = m.uleb(at)  # code alignment
    _, at = m.sleb(at)  # data alignment
    if version == 1:
        at += 1
    else:
        _, at = m.uleb(at)  # return address register
    cie = {"fde_enc": 0x00, "lsda_enc": _OMIT, "personality": None, "z": aug.startswith("z")}
    if cie["z"]:
        _, at = m.uleb(at)
        for ch in aug[1:]:
            if ch == "P":
                enc = m.u8(at)
                ptr, at = m.encoded(enc & 0x7F, at + 1)
                if not enc & 0x80:  # direct: the routine itself (indirect: a slot a relocation fills)
                    cie["personality"] = ptr
            elif ch == "L":
                cie["lsda_enc"] = m.u8(at)
                at += 1
            elif ch == "R":
                cie["fde_enc"] = m.u8(at)
                at += 1
            elif ch in "SBG":
                continue
            else:
                raise EhError(f"CIE augmentation {aug!r}")
    cies[addr] = cie
    return cie


def _fde(m: _Mem, addr: int, cies: dict) -> list[int]:
    length = m.unpack("<I", addr)
    body = addr + 4
    if length == 0xFFFFFFFF:
        body += 8
    cie_ptr = m.unpack("<I", body)
    if cie_ptr == 0:
        return []  # a CIE the table named as an FDE: nothing of its own
    cie = _cie(m, body - cie_ptr, cies)
    start, at = m.encoded(cie["fde_enc"], body + 4)
    out = [start] + ([cie["personality"]] if cie["personality"] is not None else [])
    _, at = m.encoded(cie["fde_enc"] & 0x0F, at)  # the range: a plain number
    if cie["z"]:
        _, at = m.uleb(at)
        if cie["lsda_enc"] != _OMIT:
            lsda, at = m.encoded(cie["lsda_enc"] & 0x7F, at)
            if lsda:
                if cie["lsda_enc"] & 0x80:
                    lsda = m.unpack("<Q", lsda)
                out += _landing_pads(m, lsda, start)
    return out


def _landing_pads(m: _Mem, lsda: int, func: int) -> list[int]:
    """Every landing pad of an LSDA (the C++ personality's layout: LPStart, the type table's offset, the call-site
    table)."""
    lp_enc = m.u8(lsda)
    # What g++ writes, and only that: LPStart omitted (the function's start) and a uleb128 call-site table. libgcc
    # reads other encodings too (an LPStart stored in a slot, call sites pc-relative: a red team's landing pad landed
    # inside an immediate through one this read as a plain offset); a library with them is not vouched for.
    if lp_enc != _OMIT:
        raise EhError(f"an LSDA with LPStart encoded {lp_enc:#x}")
    lp_start, at = func, lsda + 1
    ttype_enc = m.u8(at)
    at += 1
    if ttype_enc != _OMIT:
        _, at = m.uleb(at)
    cs_enc = m.u8(at)
    if cs_enc != 0x01:
        raise EhError(f"an LSDA call-site table encoded {cs_enc:#x}")
    n, at = m.uleb(at + 1)
    end, pads = at + n, []
    for _ in range(_MAX_RECORDS):
        if at >= end:
            break
        _, at = m.encoded(cs_enc & 0x0F, at)  # start, relative to the function
        _, at = m.encoded(cs_enc & 0x0F, at)  # length
        lp, at = m.encoded(cs_enc & 0x0F, at)
        _, at = m.uleb(at)  # action
        if lp:
            pads.append(lp_start + lp)
    return pads
