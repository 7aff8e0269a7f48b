"""gate/x86.py: which system-call instructions a library's code can execute. Its lengths are checked against GNU
objdump's (on libraries of this machine and on instructions chosen for their encodings); its sweep against code
written to hide a system call, and honest code that holds the same bytes inside an operand."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tilesmith.gate import allowlist_native as N
from tilesmith.gate import x86

_TOOLS = pytest.mark.skipif(not (shutil.which("objdump") and shutil.which("as")), reason="needs GNU binutils")
_LINE = re.compile(r"^\s*([0-9a-f]+):\t((?:[0-9a-f]{2} )+)\s*\t?(.*)$")


def _objdump(path: str) -> list[tuple[int, bytes, str]]:
    """(address, bytes, text) of each instruction objdump decodes in `path`, whole instructions on one line each."""
    out = subprocess.run(["objdump", "-d", "-w", "--insn-width=15", path], capture_output=True, text=True,
                         check=True).stdout
    return [(int(m.group(1), 16), bytes.fromhex(m.group(2)), m.group(3)) for m in map(_LINE.match, out.splitlines())
            if m]


def _disagreements(path: str) -> tuple[int, list]:
    """Instructions of `path` (objdump's linear decoding of every code section) whose length x86.decode gives
    otherwise. Left out: what objdump itself cannot decode, and `fwait` which it prints merged with the x87
    instruction after it (9b d9 7c 24 02: two instructions to the CPU)."""
    lib = N.read_library(open(path, "rb").read())
    n, bad = 0, []
    for addr, raw, text in _objdump(path):
        if "(bad)" in text or text.startswith((".byte", "rex", "data16")) or raw[0] == 0x9B:
            continue
        for base, code in lib.code:
            if base <= addr < base + len(code):
                n += 1
                length, _, alts, _ = x86.decode(code, addr - base)
                if len(raw) != length and len(raw) not in alts:
                    bad.append((hex(addr), raw.hex(" "), text, length))
    return n, bad


@_TOOLS
@pytest.mark.slow
def test_every_instruction_length_agrees_with_objdump_on_the_libraries_a_kernel_links():
    import torch

    gomp = [p for p in (f"{torch.__path__[0]}/lib/libgomp.so.1", "/lib/x86_64-linux-gnu/libgomp.so.1")
            if shutil.os.path.exists(p)]
    total = 0
    for path in gomp[:1] + ["/lib/x86_64-linux-gnu/libm.so.6", f"{torch.__path__[0]}/lib/libc10.so"]:
        if not shutil.os.path.exists(path):
            continue
        n, bad = _disagreements(path)
        assert not bad, (path, bad[:10])
        total += n
    assert total > 100_000


# Encodings chosen for what their length depends on: immediates by opcode and operand size, 64-bit absolute
# addresses, SIB without a base, RIP-relative operands, VEX/EVEX/XOP maps with and without an imm8, 3DNow!'s suffix,
# AMD's SSE4a (a length objdump and this module give as AMD's), AMX, FP16 maps 5 and 6.
_ASM = r"""
movabs $0x1122334455667788, %rax
movabs 0x1122334455667788, %al
movabs %eax, 0x1122334455667788
mov $0x1234, %ax
movq $-1, (%rax)
movw $1, 0x10(%rax,%rbx,4)
imul $1000, %eax, %ebx
imul $10, %eax, %ebx
push $1000
push $10
enter $0x10, $1
ret $8
xbegin 1f
1: xabort $1
testb $1, (%rax)
testl $1, (%rax)
testw $1, (%rax)
notl (%rax)
negq 0x12345678(,%rbx,8)
mov %fs:0x28, %rax
lea 0x10(%rip), %rax
call *0x10(%rip)
jmp *(%rax,%rbx,8)
loop 1b
jrcxz 1b
jmp 2f
je 2f
2: bt $3, %eax
shld $3, %eax, %ebx
shrd $3, %eax, %ebx
cmpps $1, %xmm1, %xmm2
pshufd $1, %xmm1, %xmm2
psrlq $3, %xmm1
pinsrw $1, %eax, %xmm1
pextrw $1, %xmm1, %eax
shufps $1, %xmm1, %xmm2
crc32b %al, %ebx
pclmulqdq $1, %xmm1, %xmm2
movbe (%rax), %eax
popcnt %eax, %ebx
lock cmpxchg %ebx, (%rax)
rep movsb
cs nopw 0x0(%rax,%rax,1)
.byte 0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0
endbr64
femms
pfadd %mm1, %mm2
extrq $1, $2, %xmm1
insertq $1, $2, %xmm1, %xmm2
vzeroupper
vpshufd $1, %ymm1, %ymm2
vpshufb %ymm1, %ymm2, %ymm3
vpalignr $3, %ymm1, %ymm2, %ymm3
vpextrw $1, %xmm1, %eax
vblendvps %ymm4, %ymm1, %ymm2, %ymm3
vfmadd231ps 0x20(%rax), %ymm1, %ymm2
kmovw %k1, %eax
vpshufd $1, %zmm1, %zmm2
vcmpps $1, %zmm1, %zmm2, %k1
vpternlogd $0xff, %zmm1, %zmm2, %zmm3
vmovups 0x40(%rax,%rbx,8), %zmm1
vgatherdps 0x10(%rax,%zmm1,4), %zmm2{%k1}
vpdpbusd %zmm1, %zmm2, %zmm3
vaddph %zmm1, %zmm2, %zmm3
vfmadd132ph %zmm1, %zmm2, %zmm3
vcmpph $1, %zmm1, %zmm2, %k1
vprotb $3, %xmm1, %xmm2
vfrczps %xmm1, %xmm2
tileloadd (%rax,%rbx,1), %tmm1
ldtilecfg (%rax)
tdpbssd %tmm1, %tmm2, %tmm3
int $0x80
syscall
sysenter
ud2
"""


@_TOOLS
def test_lengths_agree_with_objdump_on_encodings_chosen_for_what_a_length_depends_on(tmp_path):
    (tmp_path / "k.s").write_text(_ASM)
    subprocess.run(["as", "--64", "-o", str(tmp_path / "k.o"), str(tmp_path / "k.s")], check=True, capture_output=True)
    insns = _objdump(str(tmp_path / "k.o"))
    code = b"".join(raw for _, raw, _ in insns)
    assert len(insns) == _ASM.strip().count("\n") + 1
    kinds = []
    for addr, raw, text in insns:
        length, kind, alts, _ = x86.decode(code, addr)
        assert len(raw) == length or len(raw) in alts, (text, raw.hex(" "), length, alts)
        kinds.append(kind)
    assert kinds.count(x86.SYSCALL) == 3  # int 0x80, syscall, sysenter


# -- the sweep ---------------------------------------------------------------------------------------------------

def _calls(code: str) -> int:
    return x86.system_calls([(0x1000, bytes.fromhex(code))], [])


def test_the_bytes_of_a_system_call_inside_an_operand_are_not_one():
    assert _calls("48 8b 05 0f 34 00 00 c3") == 0  # mov rax, [rip + 0x340f] (the decoder kernel's false rejection)
    assert _calls("b8 0f 05 00 00 c3") == 0  # mov eax, 0x50f
    assert _calls("c7 44 24 08 cd 80 00 00 c3") == 0  # mov dword [rsp + 8], 0x80cd
    assert _calls("0f 05 c3") == 1  # and a plain one counts


@pytest.mark.parametrize("code", [
    "eb 01 b8 0f 05 00 00 c3",  # jmp +1 lands inside mov eax, imm32: its bytes 0f 05
    "48 8d 3d 02 00 00 00 c3 b8 0f 05 00 00 c3",  # lea rdi, [rip + 2]: a pointer into the middle of an instruction
    "e8 03 00 00 00 c3 90 b8 cd 80 00 00 c3",  # call into mov's immediate: int 0x80
    "66 0f 84 00 00 0f 05 c3",  # AMD: je rel16, not taken, falls through to 0f 05; Intel reads one 7-byte je
    "06 0f 05 c3",  # an opcode 64-bit mode refuses: every next instruction a CPU might take is decoded
    "d5 80 05 c3",  # APX's REX2 syscall: no 0f byte
])
def test_a_system_call_hidden_inside_another_instruction_is_found_where_execution_can_reach_it(code):
    assert _calls(code) == 1


def test_an_address_the_library_names_is_decoded_from():
    code = bytes.fromhex("c3 b8 0f 05 00 00 c3")  # ret, then a mov whose immediate holds 0f 05
    assert x86.system_calls([(0x1000, code)], []) == 0
    assert x86.system_calls([(0x1000, code)], [0x1002]) == 1  # a symbol or relocation pointing at its immediate


def test_a_library_whose_displacement_holds_the_bytes_passes_and_one_that_jumps_into_them_does_not(tmp_path):
    """Through the native check itself, on libraries the compiler built (see tests/test_gate_allowlist.py)."""
    if not shutil.which("gcc"):
        pytest.skip("needs gcc")
    found = {}
    for name, body in {"honest": 'asm volatile("mov $0x050f, %%eax" ::: "eax");',
                       "cheat": 'asm volatile("jmp 1f+1\\n1: .byte 0xb8, 0x0f, 0x05, 0, 0" ::: "eax", "rcx", "r11");'
                       }.items():
        src, lib = tmp_path / f"{name}.c", tmp_path / f"{name}.so"
        src.write_text(f"void kernel(void) {{ {body} }}\n")
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, capture_output=True)
        data = lib.read_bytes()
        assert re.search(rb"\x0f\x05", data)  # the bytes are there in both
        found[name] = [f.code for f in N.check_library(data)]
    # the check before the decoder counted the bytes wherever they were: the honest library's false rejection
    assert found == {"honest": [], "cheat": ["allowlist-native-syscall"]}

