"""The allowlist's native half: what a shared library a candidate brought into the gate worker links and contains.

A C++ kernel (`async_compile.cpp_pybinding`) is compiled by Inductor into a `.so` that runs in the process that
loads it: in the gate's worker, and after install in the user's own program. Its source text proves nothing (the
preprocessor can paste any name together), so the check reads the built library itself, with the standard library
only (no `nm` or `readelf`, which a machine may lack, and no output format to parse):

- the shared libraries it names (DT_NEEDED) are the C/C++ runtimes, OpenMP and torch's CPU library, and nothing
  else is loaded with it (no RPATH outside the installed software, no audit or filter libraries);
- every symbol it imports (its undefined dynamic symbols, read the way the dynamic linker finds them: PT_DYNAMIC,
  the hash tables and the relocations, never the section headers, which nothing at run time reads) is on the list
  below, each entry there because honest Inductor kernels need it;
- its code holds no system-call instruction of its own (x86-64 `syscall`, `sysenter`, `int 0x80`; aarch64 `svc`):
  on x86-64, every instruction execution can reach from an address the library names, by fall-through, a direct
  branch or a RIP-relative address, is decoded (gate/x86.py), so one hidden inside another instruction and jumped
  into is found, and the same bytes inside a displacement or an immediate are not (counted at every byte offset,
  they rejected honest kernels);
- on x86-64 no far return, call or jump or iret is reachable either: each can switch the CPU to 32-bit code, in
  which the same bytes decode otherwise;
- what runs is what the file holds: each executable segment is read as the loader maps it (whole pages), no segment
  is writable and executable, none is mapped over another, no relocation writes into code (text relocations), the
  stack is declared and not executable; the addresses decoded from include DT_RELR's packed relocations and each
  relocation's symbol plus addend, every function start, personality routine and landing pad the unwind tables
  name (gate/ehframe.py), and the symbols are counted by whichever hash table names more (a red team's ways past
  the first version of the sweep, tests/test_gate_native_layout.py);
- `getenv` and `strtoull`, which Inductor's own Python binding calls once (PyInit_kernel reads the address of a
  torch function from _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR), are referenced from one place at most (x86-64).

What this cannot see: native code that computes the address of a function it does not import (from a pointer it
holds into libc or Python, by arithmetic) reaches anything in the process; no static check of machine code rules
that out. The list closes every direct route (a call by name, however spelled in the source, a raw system call).

The gate's parent runs this on the files the worker mapped, read from outside the worker (/proc/<pid>/maps and
the worker's own view of its files, /proc/<pid>/root): never on the worker's word.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from dataclasses import dataclass, field

from tilesmith.gate import ehframe, x86

X86_64, AARCH64 = 62, 183
_PT_LOAD, _PT_DYNAMIC, _PF_X = 1, 2, 1
_DT = {"NEEDED": 1, "PLTRELSZ": 2, "HASH": 4, "STRTAB": 5, "SYMTAB": 6, "RELA": 7, "RELASZ": 8, "STRSZ": 10,
       "SYMENT": 11, "RPATH": 15, "REL": 17, "RELSZ": 18, "JMPREL": 23, "RUNPATH": 29, "GNU_HASH": 0x6FFFFEF5}
# Entries that load more code with the library (audit and filter libraries): never in a compiler's plain output.
_DT_LOADERS = {0x6FFFFEFB: "DT_DEPAUDIT", 0x6FFFFEFC: "DT_AUDIT", 0x7FFFFFFD: "DT_AUXILIARY", 0x7FFFFFFF: "DT_FILTER"}
_MAX_BYTES = 256 << 20

# The libraries a kernel may link: C, math, the C++ runtime and its unwinder, OpenMP (GNU's, LLVM's, Intel's), and
# torch's CPU library (its vectorised math, Sleef, which at::vec calls).
NEEDED = frozenset({"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libgomp.so.1", "libomp.so",
                    "libiomp5.so", "libtorch_cpu.so", "libc10.so", "libpthread.so.0", "ld-linux-x86-64.so.2",
                    "libmvec.so.1",
                    "ld-linux-aarch64.so.1"})

# Symbols imported by name, each for a reason:
SYMBOLS = frozenset({
    # memory: what the compiler emits for copies and fills, the C++ allocator's back end, bounds-checked variants
    "memcpy", "memmove", "memset", "memcmp", "strlen", "malloc", "calloc", "realloc", "free", "posix_memalign",
    "aligned_alloc", "__memcpy_chk", "__memmove_chk", "__memset_chk", "__stack_chk_fail", "__assert_fail", "abort",
    # Inductor's Python binding (codecache.CppPythonBindingsCodeCache): arguments, errors, the module object, and
    # the torch function address it reads once (getenv/strtoull/errno, limited to one call site below)
    "getenv", "strtoull", "__errno_location", "PyErr_SetString", "PyErr_Occurred", "PyExc_RuntimeError",
    "PyModule_Create2", "PyTuple_Type", "_Py_NoneStruct", "PyLong_AsSsize_t", "PyLong_AsVoidPtr", "PyFloat_AsDouble",
    "PyUnstable_Module_SetGIL", "Py_IsNone",
    # C++ runtime: exceptions (the binding turns them into Python errors), new/delete, static init and exit
    "__cxa_atexit", "__cxa_finalize", "__cxa_allocate_exception", "__cxa_free_exception", "__cxa_throw",
    "__cxa_begin_catch", "__cxa_end_catch", "__cxa_rethrow", "__cxa_guard_acquire", "__cxa_guard_release",
    "__cxa_guard_abort", "__cxa_pure_virtual", "__gxx_personality_v0", "_Unwind_Resume", "_Znwm", "_Znam",
    "_ZdlPv", "_ZdlPvm", "_ZdaPv", "_ZdaPvm", "_ZnwmSt11align_val_t", "_ZdlPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t", "_ZSt9terminatev", "_ZSt17__throw_bad_allocv", "_ZSt20__throw_length_errorPKc",
    "_ZSt19__throw_logic_errorPKc", "_ZSt24__throw_out_of_range_fmtPKcz", "_ZSt20__throw_out_of_rangePKc",
    "_ZSt28__throw_bad_array_new_lengthv", "_ZTISt9exception", "_ZTISt13runtime_error", "_ZSt25__throw_bad_function_callv",
    "_ZNSt13runtime_errorC1EPKc", "_ZNSt13runtime_errorC1ERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
    "_ZNSt13runtime_errorD1Ev", "_ZNSt13runtime_errorD2Ev", "_ZNSt6localeC1Ev", "_ZNSt6localeD1Ev",
    "_ZNSt8ios_base4InitC1Ev", "_ZNSt8ios_base4InitD1Ev", "_ZNSt8ios_baseC2Ev", "_ZNSt8ios_baseD2Ev",
    # toolchain boilerplate: weak references the C runtime files carry, never defined in a process
    "__gmon_start__", "_ITM_registerTMCloneTable", "_ITM_deregisterTMCloneTable",
    # honest g++ output a red team found refused: checked containers (-D_GLIBCXX_ASSERTIONS), make_unique<T[]>,
    # thread_local scratch buffers, `stream << "literal"` at -Os
    "_ZSt21__glibcxx_assert_failPKciS0_S0_", "__cxa_throw_bad_array_new_length", "__tls_get_addr",
    "__cxa_thread_atexit", "__cxa_thread_atexit_impl", "_ZStlsISt11char_traitsIcEERSt13basic_ostreamIcT_ES5_PKc",
})
# Plain C names a kernel library may define and call through its own relocations (see _interposable): Inductor's
# entry point, its integer-division error flag (a C++17 inline variable: a GNU_UNIQUE symbol in every CPU kernel),
# and the buffer of torch's own ISA probe (torch._inductor.cpu_vec_isa).
OWN_C_NAMES = frozenset({"kernel", "inductor_cpu_integer_div_error_flag", "in_out_ptr0"})
# C++ names in the namespaces of libraries a kernel's process holds (std, c10, at, torch, caffe2), with their typeinfo,
# typeinfo names and vtables (_ZTI, _ZTS, _ZTV), and what of them a kernel library may define and call by name.
_HELD_NAMESPACE = re.compile(r"_Z(T[ISV])?(N(K|[VKr]+)?)?(St|3c10|2at|5torch|6caffe2)")
_HONEST_MANGLED = re.compile(r"_Z(T[ISV])?(N(K|[VKr]+)?)?(St|3c106detail12_str_wrapper|2at3vec)")
_STD_UNSAFE = re.compile(r"St(13basic_filebuf|14basic_ifstream|14basic_ofstream|13basic_fstream|12__basic_file|6thread"
                         r"|11this_thread|10filesystem|6locale|13random_device|8ios_base4Init|15__exception_ptr)|St3pmr")
# Families: libm's functions (and their _finite forms), string streams over memory (the binding's error
# messages: std::ostringstream, no file or console stream), vectorised math, OpenMP inside a parallel region.
_FAMILIES = re.compile(
    r"(__)?(a?(sin|cos|tan)h?|atan2|exp(2|10|m1)?|log(2|10|1p|b)?|pow|sqrt|cbrt|hypot|erfc?|lgamma|tgamma|fmod|"
    r"remainder|fabs|floor|ceil|l?l?round|trunc|l?l?rint|nearbyint|frexp|ldexp|scalbn|modf|copysign|nextafter|"
    r"fmax|fmin|fdim|fma|sincos|ilogb|nan)[fl]?(_finite)?"
    r"|_ZNK?St7__cxx11(12basic_string|15basic_stringbuf|18basic_stringstream|19basic_ostringstream)IcSt11char_traitsIcE\w*"
    r"|_ZT[VTIS]NSt7__cxx11(15basic_stringbuf|18basic_stringstream|19basic_ostringstream)IcSt11char_traitsIcE\w*"
    r"|_ZT[VI]St(15basic_streambuf|9basic_ios)IcSt11char_traitsIcEE|_ZNSt9basic_iosIcSt11char_traitsIcEE\w+"
    r"|_ZNSo\w+|_ZNSolsE\w+|_ZSt16__ostream_insertIcSt11char_traitsIcEE\w+"
    r"|_ZN3c106detail(14torchCheckFail|19torchInternalAssertFail)\w*|Sleef_\w+"
    # std::map/set's and unordered_map's out-of-line helpers, typeinfo vtables (std::function), std's exceptions
    r"|_ZSt(18_Rb_tree_(in|de)crement|29_Rb_tree_insert_and_rebalance|28_Rb_tree_rebalance_for_erase)\w*"
    r"|_ZNKSt8__detail20_Prime_rehash_policy\w*|_ZNSt8__detail15_List_node_base\w*"
    r"|_ZTVN10__cxxabiv1(17__class|20__si_class|21__vmi_class)_type_infoE"
    r"|_ZNSt(11logic_error|12out_of_range|16invalid_argument|12length_error|12domain_error|11range_error"
    r"|14overflow_error|15underflow_error)(C[12]|D[012])E\w*"
    r"|_ZT[ISV]St(11logic_error|12out_of_range|16invalid_argument|12length_error|12domain_error|11range_error"
    r"|14overflow_error|15underflow_error|13runtime_error|9exception|9bad_alloc)"
    r"|omp_get_(thread_num|num_threads|max_threads|num_procs|level)|omp_in_parallel"
    r"|GOMP_(parallel(_end|_start|_loop_\w+|_reductions)?|barrier(_cancel)?|single_(start|copy_start|copy_end)|"
    r"critical_(start|end|name_start|name_end)|atomic_(start|end)|loop_\w+|sections_\w+|ordered_(start|end)|"
    r"task(wait|group_start|group_end|yield)?|alloc|free)"
    r"|__kmpc_(fork_call|for_static_(init_\w+|fini)|barrier|global_thread_num|(end_)?single|(end_)?critical|"
    r"(end_)?reduce\w*|push_num_threads|dispatch_\w+|(end_)?master|(end_)?masked|serialized_parallel|"
    r"end_serialized_parallel|ordered|end_ordered|flush)")
# Imported for Inductor's binding alone, which calls each once (PyInit_kernel): a second call site is the kernel's own.
GLUE_ONLY = {"getenv": 1, "strtoull": 1}


@dataclass
class Library:
    """What the dynamic linker sees of one ELF shared library."""

    machine: int
    needed: list[str] = field(default_factory=list)
    search_paths: list[str] = field(default_factory=list)  # DT_RPATH / DT_RUNPATH entries
    loaders: list[str] = field(default_factory=list)  # DT_AUDIT and the like, by name
    imports: dict[str, list[int]] = field(default_factory=dict)  # undefined symbol -> its relocation slots (vaddr)
    entries: list[int] = field(default_factory=list)  # addresses it names: defined symbols, relocations, init/fini
    layout: list[str] = field(default_factory=list)  # what in its segments and relocations no compiler's plain output has
    interposable: set[str] = field(default_factory=set)  # C names it defines and calls by name (see _interposable)
    unwind: tuple | None = None  # (file bytes, segments, .eh_frame_hdr address): what gate/ehframe.py reads
    code: list[tuple[int, bytes]] = field(default_factory=list)  # (vaddr, bytes) of each executable segment
    segment_code: list[bytes] = field(default_factory=list)  # each executable segment's own bytes, no page around


class ElfError(ValueError):
    """The file is not a 64-bit little-endian ELF library this module can read."""


def _interposable(lib: Library) -> list[str]:
    """Names the library defines (global, default visibility) and reaches through its own relocations: glibc binds
    such a reference to the first definition in the process's global scope, so `int system(const char*) {...}`
    compiled into a kernel and called calls libc's `system` (found by a red team: every libc function, past the
    import list). A C name must be one the import list allows, or the entry point. A C++ name in a namespace whose
    library the process holds (std, c10, at, torch) must be a template instantiation or class of the kinds honest
    kernels and Inductor's binding make (containers, strings, string streams, c10's message formatting, at::vec, the
    binding's python_error), never libstdc++'s files, threads, filesystem or locale, nor anything else of torch's
    (the same declaration bound to torch's own definition runs torch's code). The kernel's other functions are
    `static`, in an anonymous namespace, or hidden; a mangled name in the global or the kernel's own namespace
    names nothing another library defines."""
    out = []
    for n in lib.interposable:
        if symbol_allowed(n) or n in OWN_C_NAMES:
            continue
        if not n.startswith("_Z"):
            out.append(n)
        elif _HELD_NAMESPACE.match(n) and (_STD_UNSAFE.search(n) or not _HONEST_MANGLED.match(n)):
            out.append(n)
    return out


def symbol_allowed(name: str) -> bool:
    if name.startswith("_ZGV"):  # libmvec's vector variants (-O3 -ffast-math): _ZGVdN8v_expf is expf, 8 lanes
        m = re.fullmatch(r"_ZGV[a-zA-Z]M?N?\d+[a-zA-Z0-9]*_(\w+)", name)
        return m is not None and _FAMILIES.fullmatch(m.group(1)) is not None and not m.group(1).startswith("_Z")
    return name in SYMBOLS or _FAMILIES.fullmatch(name) is not None


def read_library(data: bytes) -> Library:
    """Parse `data` (a whole ELF file) as the dynamic linker would; raises ElfError for anything else."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    machine, = struct.unpack_from("<H", data, 0x12)
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic, spans, stack, eh_hdr = [], None, [], None, None
    for i in range(phnum):
        p_type, p_flags, off, vaddr, _, filesz, memsz, _ = _unpack("<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == _PT_LOAD:
            loads.append((vaddr, off, filesz, p_flags))
            spans.append((vaddr & -_PAGE, -(-(vaddr + max(memsz, filesz)) // _PAGE) * _PAGE))
        elif p_type == _PT_DYNAMIC:
            dynamic = (off, vaddr)
        elif p_type == _PT_GNU_STACK:
            stack = p_flags
        elif p_type == _PT_GNU_EH_FRAME:
            eh_hdr = vaddr
    lib = Library(machine, code=[_mapped_code(data, v, o, n, machine) for v, o, n, fl in loads if fl & _PF_X])
    lib.segment_code = [data[o:o + n] for v, o, n, fl in loads if fl & _PF_X]
    lib.layout += _layout(loads, spans, stack)
    lib.unwind = (data, loads, eh_hdr) if eh_hdr is not None else None
    if dynamic is None:
        raise ElfError("no dynamic section: not a shared library")
    dyn_off, dyn_vaddr = dynamic
    # glibc reads the dynamic array at PT_DYNAMIC's address up to DT_NULL, whatever its file offset and sizes say (a
    # decoy array at another offset, or a size cut short before the relocations, hid an import)
    if _offset(loads, dyn_vaddr) != dyn_off:
        lib.layout.append("has a PT_DYNAMIC whose file offset is not its address's")
    dyn = _dynamic_entries(data, _offset(loads, dyn_vaddr))
    repeated = sorted(t for t, v in dyn.items() if len(v) > 1 and t != _DT["NEEDED"])
    if repeated:  # the first is what this reads, the last what glibc's loader uses (a decoy string table hid `system`)
        lib.layout.append(f"names dynamic tag(s) {', '.join(hex(t) for t in repeated)} more than once")
    at = lambda vaddr: _offset(loads, vaddr)  # noqa: E731
    strtab = at(_one(dyn, "STRTAB"))
    name = lambda off: _cstr(data, strtab + off)  # noqa: E731
    lib.needed = [name(v) for v in dyn.get(_DT["NEEDED"], [])]
    lib.search_paths = [p for v in dyn.get(_DT["RPATH"], []) + dyn.get(_DT["RUNPATH"], []) for p in name(v).split(":")]
    lib.loaders = [label for tag, label in _DT_LOADERS.items() if tag in dyn]
    relocs = _relocations(data, dyn, at)
    symtab = at(_one(dyn, "SYMTAB"))
    count = max([_hash_count(data, dyn, at)] + [s + 1 for s, _, _ in relocs])
    for i in range(1, count):
        st_name, _, _, st_shndx = _unpack("<IBBH", data, symtab + 24 * i)
        if st_shndx == 0 and st_name:  # SHN_UNDEF: resolved from another library at load
            lib.imports.setdefault(name(st_name), [])
        elif st_shndx:
            lib.entries.append(_unpack("<Q", data, symtab + 24 * i + 8)[0])
    for sym, slot, _ in relocs:
        if sym:
            st_name, st_info, st_other, st_shndx = _unpack("<IBBH", data, symtab + 24 * sym)
            if st_shndx == 0 and st_name:
                lib.imports.setdefault(name(st_name), []).append(slot)
            elif st_name and st_info >> 4 != 0 and st_other & 3 == 0:
                # any binding but local (GNU_UNIQUE too), default visibility: the loader looks the name up in the
                # global scope first, -Bsymbolic or not (a definition it will not take, st_value 0, goes there too)
                lib.interposable.add(name(st_name))
    lib.entries += _named_addresses(data, dyn, loads, symtab, relocs)
    relr = _relr_slots(data, dyn, at)
    slots = [slot for _, slot, _ in relocs] + relr
    for slot in relr:
        try:
            lib.entries.append(_unpack("<Q", data, _offset(loads, slot))[0])
        except ElfError:
            pass  # a slot in memory the file does not hold
    if 22 in dyn or any(v & 4 for v in dyn.get(30, [])):  # DT_TEXTREL, DT_FLAGS' DF_TEXTREL
        lib.layout.append("relocates its own code (text relocations)")
    elif any(lo <= s < hi for s in slots for lo, hi in ((b, b + len(c)) for b, c in lib.code)):
        lib.layout.append("has a relocation that writes into its code")
    return lib


_PAGE = 4096  # mappings are whole pages: bytes of the file around a segment on its pages are mapped with it
_PT_GNU_STACK, _PT_GNU_EH_FRAME = 0x6474E551, 0x6474E550


def _mapped_code(data: bytes, vaddr: int, off: int, filesz: int, machine: int) -> tuple[int, bytes]:
    """An executable segment as the loader maps it: from its first page's start to its last page's end (on aarch64
    pages of up to 64 KiB), the file's bytes there; the segment's own bytes are only part of what runs."""
    page = 1 << 16 if machine == AARCH64 else _PAGE
    head = min(vaddr % page, off)
    end = min(len(data), off + filesz + (-(vaddr + filesz)) % page)
    return vaddr - head, data[off - head:end]


def _layout(loads: list, spans: list, stack: int | None) -> list[str]:
    """Segment properties no compiler's plain output of a kernel has, each a way to run bytes the check never read:
    a segment writable and executable (code that writes itself), segments mapped over each other (the later one
    wins, unseen), an executable stack or none declared (the loader then makes the stack executable)."""
    out = []
    if any(fl & _PF_X and fl & 2 for *_, fl in loads):
        out.append("has a segment both writable and executable")
    ordered = sorted(spans)
    if any(a[1] > b[0] for a, b in zip(ordered, ordered[1:])):
        out.append("maps segments over each other")
    if stack is None or stack & _PF_X:
        out.append("asks for an executable stack" if stack is not None else "declares no stack (PT_GNU_STACK): the "
                   "loader would make the stack executable")
    return out


def _relr_slots(data: bytes, dyn: dict, at) -> list[int]:
    """The slots DT_RELR's packed relative relocations write (-z pack-relative-relocs): an address entry, then
    bitmaps of the 63 words after it."""
    if 36 not in dyn or 35 not in dyn:
        return []
    base, n = at(dyn[36][0]), dyn[35][0] // 8
    out, where = [], 0
    for i in range(n):
        e, = _unpack("<Q", data, base + 8 * i)
        if not e & 1:
            out.append(e)
            where = e + 8
        else:
            out += [where + 8 * k for k in range(63) if e >> (k + 1) & 1]
            where += 63 * 8
    return out


def _named_addresses(data: bytes, dyn: dict, loads: list, symtab: int, relocs: list) -> list[int]:
    """Addresses the dynamic linker hands the code: DT_INIT/DT_FINI, each relocation's addend (RELA), its symbol's
    value plus that addend, and each relocated slot's stored value (REL, and the init/fini arrays' entries)."""
    out = [v for tag in (12, 13) for v in dyn.get(tag, [])]
    for array, size in ((25, 27), (26, 28)):  # DT_INIT_ARRAY / DT_FINI_ARRAY and their sizes
        for v, n in zip(dyn.get(array, []), dyn.get(size, [])):
            try:
                out += list(struct.unpack_from(f"<{n // 8}Q", data, _offset(loads, v)))
            except (ElfError, struct.error):
                pass
    for sym, slot, addend in relocs:
        out.append(addend)
        if sym:  # against a symbol: where it points is the symbol's value plus the addend
            out.append(_unpack("<Q", data, symtab + 24 * sym + 8)[0] + addend)
        try:
            out.append(_unpack("<Q", data, _offset(loads, slot))[0])
        except ElfError:
            pass  # a slot in memory the file does not hold (.bss)
    return out


def _unpack(fmt: str, data: bytes, off: int) -> tuple:
    try:
        return struct.unpack_from(fmt, data, off)
    except struct.error:
        raise ElfError(f"truncated at offset {off}") from None


def _dynamic_entries(data: bytes, off: int, size: int | None = None) -> dict[int, list[int]]:
    """The dynamic array at file offset `off`, read as the loader reads it: up to DT_NULL (`size` bounds it only
    where a caller knows better); ElfError where the file ends first."""
    out: dict[int, list[int]] = {}
    for i in range((size // 16) if size is not None else (len(data) - off) // 16 + 1):
        tag, val = _unpack("<qQ", data, off + 16 * i)
        if tag == 0:
            return out
        out.setdefault(tag, []).append(val)
    if size is None:
        raise ElfError("the dynamic array has no DT_NULL")
    return out


def _one(dyn: dict, key: str) -> int:
    vals = dyn.get(_DT[key])
    if not vals:
        raise ElfError(f"no DT_{key}")
    return vals[0]


def _offset(loads: list, vaddr: int) -> int:
    for v, off, filesz, _ in loads:
        if v <= vaddr < v + filesz:
            return off + vaddr - v
    raise ElfError(f"address {vaddr:#x} is in no loaded segment")


def _cstr(data: bytes, off: int) -> str:
    end = data.find(b"\0", off)
    if end < 0:
        raise ElfError("unterminated string")
    return data[off:end].decode("utf-8", "replace")


def _relocations(data: bytes, dyn: dict, at) -> list[tuple[int, int, int]]:
    """(symbol index, slot address, addend: 0 for REL) of every RELA/REL relocation the dynamic linker applies."""
    out = []
    for table, size, entsize in (("RELA", "RELASZ", 24), ("JMPREL", "PLTRELSZ", 24 if dyn.get(20, [7])[0] == 7 else 16),
                                 ("REL", "RELSZ", 16)):
        if _DT[table] not in dyn:
            continue
        base, n = at(_one(dyn, table)), _one(dyn, size) // entsize
        for i in range(n):
            r_offset, r_info = _unpack("<QQ", data, base + entsize * i)
            addend = _unpack("<q", data, base + entsize * i + 16)[0] if entsize == 24 else 0
            out.append((r_info >> 32, r_offset, addend))
    return out


def _hash_count(data: bytes, dyn: dict, at) -> int:
    """How many dynamic symbols there are, the most either table says: DT_HASH's count, or where DT_GNU_HASH's last
    chain ends (the loader looks names up through DT_GNU_HASH where both exist, so a DT_HASH that counts fewer must
    not hide a symbol)."""
    n = _unpack("<II", data, at(_one(dyn, "HASH")))[1] if _DT["HASH"] in dyn else 0
    if _DT["GNU_HASH"] not in dyn:
        return n
    return max(n, _gnu_hash_count(data, dyn, at))


def _gnu_hash_count(data: bytes, dyn: dict, at) -> int:
    h = at(_one(dyn, "GNU_HASH"))
    nbuckets, symoffset, bloom_size, _ = _unpack("<IIII", data, h)
    buckets = h + 16 + 8 * bloom_size
    last = max([_unpack("<I", data, buckets + 4 * i)[0] for i in range(nbuckets)] + [0])
    if last < symoffset:
        return symoffset
    chains = buckets + 4 * nbuckets
    while not _unpack("<I", data, chains + 4 * (last - symoffset))[0] & 1:
        last += 1
    return last + 1


# -- what the library's code contains ----------------------------------------------------------------------------

# syscall, sysenter, int 0x80, and syscall/sysenter under APX's REX2 prefix: one of these is in every such instruction
_X86_SYSCALL_BYTES = re.compile(rb"\x0f[\x05\x34]|\xcd\x80|\xd5[\x80-\xff][\x05\x34]")


def raw_system_calls(lib: Library) -> tuple[int, int]:
    """System-call instructions in the executable segments, and far transfers (which can switch the CPU to 32-bit
    code, where other bytes are a system call): on x86-64, those the code can reach (gate/x86.py) from the addresses
    the library names and those its unwind tables name (gate/ehframe.py), decoded only where a system call's bytes
    occur at all (in either mode: without them no mode has one); on aarch64 any aligned word. Raises
    ehframe.EhError where the unwind tables cannot be read."""
    if lib.machine == X86_64:
        if not any(_X86_SYSCALL_BYTES.search(code) for _, code in lib.code):
            return 0, 0
        unwound = ehframe.code_addresses(*lib.unwind) if lib.unwind else []
        found = x86.reachable(lib.code, lib.entries + unwound)
        return found[x86.SYSCALL], found[x86.FAR]
    n = 0
    for _, code in lib.code:
        if lib.machine == AARCH64:
            words = struct.unpack_from(f"<{len(code) // 4}I", code)
            n += sum(1 for w in words if w & 0xFFE0001F == 0xD4000001)  # svc #imm
    return n, 0


def call_sites(lib: Library, symbol: str) -> int:
    """x86-64: how many places in the code reach `symbol` through its import slot: a call or jump to its PLT stub,
    or a RIP-relative operand that reads the slot (`call *slot`, `mov reg, slot`), at any byte offset. The stub
    itself (`jmp *slot`) is not counted. A pointer computed at run time is not seen (see the module docstring)."""
    slots = set(lib.imports.get(symbol, ()))
    if not slots:
        return 0
    stubs, sites = set(), []
    for base, code in lib.code:
        for w in range(2, len(code) - 3):
            target = base + w + 4 + struct.unpack_from("<i", code, w)[0]
            prev = code[w - 1]
            if target in slots and prev & 0xC7 == 0x05:  # ModRM: [rip + disp32]
                if prev == 0x25 and code[w - 2] == 0xFF:  # jmp *slot: a PLT stub (its entry may start with endbr64)
                    stubs.update(base + w - k for k in (2, 3, 6, 7))
                else:
                    sites.append(target)
            elif prev in (0xE8, 0xE9):  # call / jmp rel32
                sites.append(target)
    return sum(1 for t in sites if t in slots or t in stubs)


# -- the check --------------------------------------------------------------------------------------------------

@dataclass
class NativeFinding:
    code: str  # allowlist-native-symbol | allowlist-native-library | allowlist-native-syscall | allowlist-native-unreadable
    message: str


def check_library(data: bytes, installed: tuple[str, ...] = ()) -> list[NativeFinding]:
    """Everything in the library `data` that an honest Inductor kernel does not need. installed: folders of the
    installed software, where a search path (RPATH/RUNPATH) may point."""
    try:
        lib = read_library(data)
    except ElfError as e:
        return [NativeFinding("allowlist-native-unreadable", f"cannot be read as a shared library: {e}")]
    out = []
    if lib.machine not in (X86_64, AARCH64):
        out.append(NativeFinding("allowlist-native-unreadable", f"is built for machine {lib.machine}, which this "
                                                                "check cannot read"))
    for n in lib.needed:
        if n not in NEEDED:
            out.append(NativeFinding("allowlist-native-library", f"links {n}"))
    for p in lib.search_paths:
        if not os.path.isabs(p) or not any(os.path.realpath(p).startswith(r.rstrip("/") + "/") for r in installed):
            out.append(NativeFinding("allowlist-native-library", f"searches {p!r} for libraries"))
    out += [NativeFinding("allowlist-native-library", f"loads more code with it ({x})") for x in lib.loaders]
    out += [NativeFinding("allowlist-native-library", x) for x in lib.layout]
    bad = sorted(s for s in lib.imports if not symbol_allowed(s))
    bad += sorted(_interposable(lib))
    if bad:
        shown = ", ".join(bad[:12]) + (f" and {len(bad) - 12} more" if len(bad) > 12 else "")
        out.append(NativeFinding("allowlist-native-symbol", f"imports {shown}"))
    if lib.machine == X86_64:
        for sym, most in GLUE_ONLY.items():
            n = call_sites(lib, sym)
            if n > most:
                out.append(NativeFinding("allowlist-native-symbol", f"calls {sym} from {n} places (Inductor's binding "
                                                                    f"calls it from {most})"))
    try:
        n, far = raw_system_calls(lib)
    except ehframe.EhError as e:
        out.append(NativeFinding("allowlist-native-unreadable", f"has unwind tables this check cannot read ({e})"))
        n = far = 0
    if n:
        out.append(NativeFinding("allowlist-native-syscall", f"holds {n} system-call instruction(s) of its own"))
    if far:
        out.append(NativeFinding("allowlist-native-syscall", f"holds {far} far transfer(s) (a far return, call or "
                                                             "jump can switch the CPU to 32-bit code)"))
    return out


# -- the libraries a process has mapped ---------------------------------------------------------------------------

# sha256 of a library's bytes -> its findings (the same file, again)
_checked: dict[str, list[NativeFinding]] = {}


def installed_roots() -> tuple[str, ...]:
    """Where the installed software lives (a search path may point there): the interpreter and system libraries."""
    import site
    import sys

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, "/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib",
             "/usr/local/cuda"}
    roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    return tuple(sorted(os.path.realpath(r) for r in roots))


def mapped_files(pid: int) -> list[tuple[int, str]]:
    """(pid, path) of every file mapped executable in process `pid` and every process under it, read from /proc (the
    kernel's account, which nothing the processes run can change); paths as each process sees them."""
    from tilesmith.gate.procfs import process_tree

    out = []
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/maps") as f:
                lines = f.read().splitlines()
        except OSError:
            continue  # gone since it was listed
        for line in lines:
            parts = line.split(None, 5)
            if len(parts) == 6 and "x" in parts[1] and parts[5].startswith("/"):
                out.append((p, parts[5]))
    return list(dict.fromkeys(out))


def check_process(pid: int, under: tuple[str, ...], skip: tuple[str, ...] = ()) -> list[NativeFinding]:
    """Every library that process `pid` (or one under it) mapped from a folder in `under` (where builds land) and not
    in `skip` (a trusted generator's cache), read through the process's own view of its files (/proc/<pid>/root),
    checked with check_library. Findings name the library."""
    def inside(path: str, roots) -> bool:
        return any(path.startswith(r.rstrip("/") + "/") for root in roots for r in {root, os.path.realpath(root)})

    out, installed = [], installed_roots()
    for p, path in mapped_files(pid):
        path = path.removesuffix(" (deleted)")
        if not inside(path, under) or inside(path, skip):
            continue
        try:
            with open(f"/proc/{p}/root{path}", "rb") as f:
                data = f.read(_MAX_BYTES + 1)
        except OSError as e:
            out.append(NativeFinding("allowlist-native-unreadable", f"{os.path.basename(path)}: cannot be read from "
                                                                     f"outside the process ({e.strerror})"))
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest not in _checked:
            _checked[digest] = check_library(data, installed) if len(data) <= _MAX_BYTES else [
                NativeFinding("allowlist-native-unreadable", "is larger than this check reads")]
        out += [NativeFinding(f.code, f"{os.path.basename(path)} {f.message}") for f in _checked[digest]]
    return out
