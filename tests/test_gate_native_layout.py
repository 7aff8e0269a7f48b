"""The native check against libraries that run a system call the file's plain reading never shows: a red team's
(2026-12-07) ways past gate/x86.py's sweep, each built here with gcc and the linker's ordinary options, each
calling getpid (or exit) when its `kern` runs. Every one passed `check_library` before its fix."""

from __future__ import annotations

import shutil
import struct
import subprocess

import pytest

from tilesmith.gate import allowlist_native as N

pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")

_SYSCALL = ".byte 0xb8, 0x27, 0, 0, 0, 0x0f, 0x05, 0xc3"  # mov eax, 39 (getpid); syscall; ret

# kernel throws; `decoy` is a movabs whose immediate, from its third byte, is push 60; pop rax; push 42; pop rdi;
# syscall (exit(42), run by a red team's library: check_library found nothing before the unwind tables were read)
_THROWS = """.text
.globl kernel
.type kernel,@function
kernel:
.LFB0: .cfi_startproc
{personality}
{lsda}
 subq $8, %rsp
 .cfi_def_cfa_offset 16
 movl $8, %edi
 call __cxa_allocate_exception@PLT
 movq $0, (%rax)
 movq %rax, %rdi
 movq _ZTISt9exception@GOTPCREL(%rip), %rsi
 xorl %edx, %edx
.LEHB0:
 call __cxa_throw@PLT
.LEHE0:
 .cfi_endproc
decoy: movabsq $0x050f5f2a6a583c6a, %rax
 ret
{table}
"""
_LSDA = """.section .gcc_except_table,"a",@progbits
.align 4
.LLSDA0:
 .byte 0xff
 .byte 0x9b
 .uleb128 .LLSDATT0 - .LLSDATTD0
.LLSDATTD0:
 .byte 0x1
 .uleb128 .LLSDACSE0 - .LLSDACSB0
.LLSDACSB0:
 .uleb128 .LEHB0 - .LFB0
 .uleb128 .LEHE0 - .LEHB0
 .uleb128 decoy + 2 - .LFB0
 .uleb128 0x1
.LLSDACSE0:
 .byte 0x1
 .byte 0
 .align 4
 .long 0
.LLSDATT0:
.hidden DW.ref.__gxx_personality_v0
.weak DW.ref.__gxx_personality_v0
.section .data.rel.local.DW.ref.__gxx_personality_v0,"awG",@progbits,DW.ref.__gxx_personality_v0,comdat
.align 8
.type DW.ref.__gxx_personality_v0, @object
.size DW.ref.__gxx_personality_v0, 8
DW.ref.__gxx_personality_v0:
 .quad __gxx_personality_v0
"""

CASES = {
    # the executable mapping is whole pages: file bytes after the segment's end on its last page run too
    "page-tail": ("c", '__attribute__((visibility("hidden"))) unsigned char blob[16] = {0xb8, 0x27, 0, 0, 0, 0x0f, '
                       '0x05, 0xc3};\n__asm__(".text\\n.globl kern\\n.type kern,@function\\nkern:\\n  jmp blob - 0x1000\\n");\n',
                  ["-Wl,-z,noseparate-code", "-Wl,-z,norelro"], "allowlist-native-syscall"),
    # the loader writes a relocation into the code: the file holds zeros where the syscall will be
    "text-relocation": ("s", ".text\n.globl kern\n.type kern,@function\nkern: .quad magic\n.globl magic\n"
                             ".set magic, 0xc3050f00000027b8\n", ["-Wl,-z,notext"], "allowlist-native-library"),
    # code in a writable segment writes its own syscall
    "writable-code": ("s", '.section .wtext,"awx",@progbits\n.globl kern\n.type kern,@function\n'
                           "kern: movw $0x040f, patch(%rip)\n incb patch+1(%rip)\n mov $39, %eax\npatch: nop\n nop\n ret\n",
                      [], "allowlist-native-library"),
    # a pointer only a packed relative relocation (DT_RELR) holds, to bytes the sweep reads as a movabs immediate
    "relr-pointer": ("s", ".data\n.p2align 3\nptr: .quad hidden_fn\n.text\n.globl kern\n.type kern,@function\n"
                          f"kern: jmp *ptr(%rip)\n nop\n.byte 0x48, 0xb8\nhidden_fn: {_SYSCALL}\n",
                     ["-Wl,-z,pack-relative-relocs"], "allowlist-native-syscall"),
    # a relocation against a symbol plus an addend: only their sum is where it points
    "symbol-plus-addend": ("s", ".data\n.p2align 3\nptr: .quad kern2 + 2\n.text\n.globl kern, kern2\n"
                                f".type kern,@function\nkern: jmp *ptr(%rip)\nkern2: .byte 0x48, 0xb8\n{_SYSCALL}\n",
                           [], "allowlist-native-syscall"),
    # a far return to the 32-bit code segment: the same bytes, decoded as 32-bit code, are int 0x80
    "compatibility-mode": ("s", ".text\n.globl kern\n.type kern,@function\nkern: lea 1f(%rip), %rax\n push $0x23\n"
                                " push %rax\n lretq\n.p2align 4\n1: .byte 0x48, 0xb8, 1, 0, 0, 0, 0xbb, 0x2a, 0, 0, 0, "
                                "0xcd, 0x80\n", [], "allowlist-native-syscall"),
    # a libc function's name defined in the kernel and called through the PLT: the loader binds it to libc's own
    "defines-a-libc-name": ("c", 'int system(const char *c) { (void)c; return -1; }\n'
                                 'int kernel(void) { return system("true"); }\n', [], "allowlist-native-symbol"),
    # a libstdc++ member defined under its mangled name and called: bound to libstdc++'s basic_filebuf::open
    "defines-a-libstdcpp-name": ("c", "void *fake_open(void *self, const char *p, int mode) "
                                      '__asm__("_ZNSt13basic_filebufIcSt11char_traitsIcEE4openEPKcSt13_Ios_Openmode");\n'
                                      "void *fake_open(void *self, const char *p, int mode) { return self; }\n"
                                      'int kernel(void) { return fake_open(0, "/tmp/x", 16) != 0; }\n', [],
                                 "allowlist-native-symbol"),
    # the same by a GNU_UNIQUE definition (no function at all): the loader still looks the name up globally first
    "unique-libc-name": ("c", '#include <stdlib.h>\n__asm__(".section .rodata\\n.globl system\\n.type system, '
                              '@gnu_unique_object\\n.size system, 8\\nsystem: .quad 0\\n.text\\n");\n'
                              'int kernel(void) { return system("true"); }\n', [], "allowlist-native-symbol"),
    # the unwinder calls a personality routine a CIE names (pc-relative, no relocation): inside a movabs immediate
    "personality-in-an-immediate": ("s", _THROWS.format(personality=".cfi_personality 0x1b, decoy + 2", lsda="",
                                                        table=""), ["-lstdc++"], "allowlist-native-syscall"),
    # the unwinder jumps to a landing pad the LSDA names (an offset from the function's start), the standard
    # personality catching everything
    "landing-pad-in-an-immediate": ("s", _THROWS.format(
        personality=".cfi_personality 0x9b, DW.ref.__gxx_personality_v0", lsda=".cfi_lsda 0x1b, .LLSDA0",
        table=_LSDA), ["-lstdc++"], "allowlist-native-syscall"),
    # the landing pad by a pc-relative call-site table, which libgcc reads as such (g++ writes uleb128 only)
    "landing-pad-pc-relative": ("s", _THROWS.format(
        personality=".cfi_personality 0x9b, DW.ref.__gxx_personality_v0", lsda=".cfi_lsda 0x1b, .LLSDA0",
        table=_LSDA.replace(" .byte 0xff\n .byte 0x9b", " .byte 0x00\n .quad 0\n .byte 0x9b").replace(
            " .byte 0x1\n .uleb128 .LLSDACSE0", " .byte 0x1b\n .uleb128 .LLSDACSE0").replace(
            " .uleb128 .LEHB0 - .LFB0\n .uleb128 .LEHE0 - .LEHB0\n .uleb128 decoy + 2 - .LFB0",
            " .long 0\n .long 0x10000000\n.Llp: .long decoy + 2 - .Llp")), ["-lstdc++"],
        "allowlist-native-unreadable"),
    # the controls: an honest C++ throw and catch with the syscall's bytes in an immediate (its unwind tables read) ...
    "honest-exceptions": ("cpp", '#include <stdexcept>\nextern "C" int kernel(int x) {\n  try {\n'
                                 '    asm volatile("mov $0x050f, %%eax" ::: "eax");\n'
                                 '    if (x > 3) throw std::runtime_error("x");\n    return x;\n'
                                 '  } catch (const std::exception&) { return -1; }\n}\n', ["-lstdc++"], None),
    # ... C++ as an agent writes it: a helper in the global namespace, std containers, their instantiations called by
    # name (the interposition rule leaves them alone) ...
    "honest-cpp-helpers": ("cpp", '#include <vector>\n#include <algorithm>\nint helper(int x) { return 2 * x; }\n'
                                  'extern "C" int kernel(int n) {\n  std::vector<int> v;\n'
                                  '  for (int i = 0; i < n; ++i) v.push_back(helper(n - i));\n'
                                  '  std::sort(v.begin(), v.end());\n  return v.empty() ? 0 : v[0];\n}\n', [], None),
    # ... the standard library as agents use it: ordered and hashed maps, std::function, std's exceptions ...
    "honest-cpp-std": ("cpp", '#include <map>\n#include <unordered_map>\n#include <functional>\n#include <stdexcept>\n'
                              'extern "C" int kernel(int n) {\n  std::map<int, int> m; std::unordered_map<int, int> u;\n'
                              '  std::function<int(int)> f = [n](int x) { return x + n; };\n'
                              '  for (int i = 0; i < n; ++i) { m[i] = f(i); u[i] = i; }\n'
                              '  if (n > 100) throw std::out_of_range("n");\n'
                              '  return m.begin()->second + (int)u.size();\n}\n', [], None),
    # ... and the syscall's bytes inside an immediate, nothing reaching them
    "honest": ("s", ".text\n.globl kern\n.type kern,@function\nkern: mov $0xc3050f, %eax\n ret\n", [], None),
}


_NOTE = '.section .note.GNU-stack,"",@progbits\n'  # what a compiler's assembly ends with: the stack not executable


def _build(tmp_path, name: str) -> bytes:
    lang, src, flags, _ = CASES[name]
    src += _NOTE if lang == "s" else ""
    f = tmp_path / f"{name}.{lang}"
    f.write_text(src)
    out = tmp_path / f"{name}.so"
    cc = "g++" if lang == "cpp" else "gcc"
    p = subprocess.run([cc, "-O2", "-shared", "-fPIC", str(f), *flags, "-o", str(out)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"this toolchain cannot build {name}: {p.stderr[-300:]}")
    return out.read_bytes()


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_library_that_runs_a_system_call_the_file_does_not_show_is_refused(tmp_path, name):
    codes = {f.code for f in N.check_library(_build(tmp_path, name))}
    want = CASES[name][3]
    assert (want in codes) if want else not codes, codes


def test_a_symbol_the_hash_table_the_loader_does_not_read_leaves_out_is_still_decoded_from(tmp_path):
    """`--hash-style=both` with DT_HASH's count cut to 1: the loader looks `kern` up through DT_GNU_HASH, which still
    names it, so the check counts symbols by whichever table names more."""
    src = tmp_path / "h.s"
    src.write_text(f".text\n.globl pre, kern\n.type kern,@function\npre: .byte 0x48, 0xb8\nkern: {_SYSCALL}\n{_NOTE}")
    out = tmp_path / "h.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,--hash-style=both", str(src), "-o", str(out)], check=True,
                   capture_output=True)
    data = bytearray(out.read_bytes())
    lib = N.read_library(bytes(data))
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads = []
    dyn_off = None
    for i in range(phnum):
        p_type, _, off, vaddr, _, filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((vaddr, off, filesz, 0))
        elif p_type == 2:
            dyn_off = off
    entries = N._dynamic_entries(bytes(data), dyn_off, 4096)
    hash_at = N._offset(loads, entries[4][0])
    struct.pack_into("<I", data, hash_at + 4, 1)  # nchain = 1: DT_HASH names no symbol
    assert [f.code for f in N.check_library(bytes(data))] == ["allowlist-native-syscall"]
    assert lib.imports is not None


def test_segments_mapped_over_each_other_are_refused():
    """A second executable PT_LOAD at the first one's address: the loader maps the later one over it."""
    loads = [(0x1000, 0x1000, 0x100, 5), (0x1000, 0x3000, 0x1000, 5)]
    spans = [(0x1000, 0x2000), (0x1000, 0x2000)]
    assert "maps segments over each other" in N._layout(loads, spans, 6)
    # and a library whose assembly leaves the stack's note out gets an executable stack from the loader
    assert N._layout(loads[:1], spans[:1], 6) == []
    assert N._layout(loads[:1], spans[:1], 7) and N._layout(loads[:1], spans[:1], None)  # an executable stack


def test_a_dynamic_tag_named_twice_is_refused(tmp_path):
    """glibc's loader keeps the last of a repeated tag, this check read the first: a decoy DT_STRTAB first, where
    `system` read `memcpy`, hid the import (a red team's round 2). The library here: an honest one with its
    DT_STRTAB named once more, in one of the spare slots the linker leaves."""
    src = tmp_path / "k.c"
    src.write_text("int kernel(int x) { return x + 1; }\n")
    out = tmp_path / "k.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(src), "-o", str(out)], check=True, capture_output=True)
    data = bytearray(out.read_bytes())
    assert N.check_library(bytes(data)) == []
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    (dyn_off, dyn_size), = [struct.unpack_from("<QQQQQ", data, phoff + i * phentsize + 8)[0:5:4]
                            for i in range(phnum) if struct.unpack_from("<I", data, phoff + i * phentsize)[0] == 2]
    entries = [struct.unpack_from("<qQ", data, dyn_off + 16 * k) for k in range(dyn_size // 16)]
    used = next(k for k, (tag, _) in enumerate(entries) if tag == 0)
    assert used + 1 < len(entries), "no spare slot in .dynamic"
    strtab = next(e for e in entries if e[0] == 5)
    entries = [strtab] + entries[:used] + [(0, 0)] * (len(entries) - used - 1)
    for k, (tag, val) in enumerate(entries):
        struct.pack_into("<qQ", data, dyn_off + 16 * k, tag, val)
    found = N.check_library(bytes(data))
    assert [f.code for f in found] == ["allowlist-native-library"] and "0x5" in found[0].message, found


@pytest.mark.parametrize("name,allowed", [
    ("_ZNKSt7__cxx1115basic_stringbufIcSt11char_traitsIcESaIcEE3strEv", True),  # ostringstream::str(), const
    ("_ZSt21__glibcxx_assert_failPKciS0_S0_", True), ("__cxa_throw_bad_array_new_length", True),
    ("__tls_get_addr", True), ("_ZGVdN8v_expf", True), ("_ZGVbN2vv_pow", True),  # libmvec's expf and pow
    ("_ZGVdN8v_system", False), ("system", False), ("dlopen", False),
])
def test_what_honest_gpp_output_imports_is_allowed_and_nothing_beside_it(name, allowed):
    """A red team's honest g++ builds (-D_GLIBCXX_ASSERTIONS, make_unique<T[]>, thread_local, -O3 -ffast-math's
    vector math from libmvec) were refused for these imports."""
    assert N.symbol_allowed(name) is allowed


def test_the_dynamic_array_is_read_where_the_loader_reads_it(tmp_path):
    """glibc reads the dynamic array at PT_DYNAMIC's address up to DT_NULL: with DT_STRTAB and DT_SYMTAB moved first and
    PT_DYNAMIC's sizes cut to those two entries, this check read no relocations and no imports, and `system` ran
    (a red team's round 3)."""
    src = tmp_path / "d.c"
    src.write_text('#include <stdlib.h>\nint kernel(void) { return system("true"); }\n')
    out = tmp_path / "d.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(src), "-o", str(out)], check=True, capture_output=True)
    data = bytearray(out.read_bytes())
    assert "imports system" in " ".join(f.message for f in N.check_library(bytes(data)))
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    (ph,) = [phoff + i * phentsize for i in range(phnum) if struct.unpack_from("<I", data, phoff + i * phentsize)[0] == 2]
    dyn_off, = struct.unpack_from("<Q", data, ph + 8)
    size, = struct.unpack_from("<Q", data, ph + 32)
    entries = [struct.unpack_from("<qQ", data, dyn_off + 16 * k) for k in range(size // 16)]
    first = [e for e in entries if e[0] in (5, 6)]
    entries = first + [e for e in entries if e[0] not in (5, 6)]
    for k, (tag, val) in enumerate(entries):
        struct.pack_into("<qQ", data, dyn_off + 16 * k, tag, val)
    struct.pack_into("<QQ", data, ph + 32, 32, 32)  # p_filesz, p_memsz: the two entries alone
    assert "imports system" in " ".join(f.message for f in N.check_library(bytes(data)))
