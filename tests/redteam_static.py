"""Issue 35's cheats, each made by editing a real captured wrapper (the inference example's, CPU): every one passes the
denylist screen (tilesmith.gate.static.screen) by reaching sys, os or ctypes through torch's own module attributes,
operator.attrgetter, ctypes found in sys.modules, code run from a hex string, or C++ whose names the preprocessor
pastes together. The allowlist (tilesmith.gate.allowlist, allowlist_native) must reject each one: CHEATS maps a
maker to the reason code expected. Written to be rejected, not run: none of them is ever loaded by these tests.
"""

from __future__ import annotations

import re

from tests.gate_helpers import _after_clear, _before_return, _return_name


def _module_code(text: str, code: str) -> str:
    assert "\nclass Runner:" in text
    return text.replace("\nclass Runner:", "\n" + code.strip("\n") + "\n\n\nclass Runner:", 1)


def alarm_fills_outputs_after_the_window(text: str) -> str:
    """Returns uncomputed outputs and arms SIGALRM (signal reached through torch's own `sys`) to compute them 2 ms
    later, after the timed window closed: the digest reads right values."""
    name = _return_name(text)
    text = _module_code(text, '''
_signal = torch.sys.modules["signal"]


def _arm(fill):
    _signal.signal(_signal.SIGALRM, lambda *_: fill())
    _signal.setitimer(_signal.ITIMER_REAL, 0.002)
''')
    return _before_return(text, f"_out = torch.empty_like({name})\n_arm(lambda: _out.copy_({name}))\n{name} = _out")


def ctypes_writes_into_the_worker(text: str) -> str:
    """Finds ctypes in sys.modules (through operator.attrgetter on torch) and writes into the gate worker's memory:
    eight bytes into the object of its clock module, at an address it computes."""
    return _after_clear(text, '''import operator
_mods = operator.attrgetter("sys.modules")(torch)
_ct = _mods["ctypes"]
_ct.memmove(id(_mods["tilesmith.gate.clock"]) + 16, _ct.c_char_p(b"\\0" * 8), 8)''')


def arms_a_handler_in_the_warm_up(text: str) -> str:
    """In a call made by the worker's warm-up (op_warm on the stack, walked with operator.attrgetter), sets a SIGALRM
    handler (signal found in torch's own `sys`) that later fills the timed window's outputs."""
    return _after_clear(text, '''import operator as _op
_f = _op.attrgetter("_getframe")(torch.sys)(1)
while _f is not None and _f.f_code.co_name != "op_warm":
    _f = _op.attrgetter("f_back")(_f)
if _f is not None:
    torch.sys.modules["signal"].signal(14, lambda *_: None)''')


SPINNER_PRELUDE = r'''
#include <pthread.h>
#define GLUE(a, b) a##b
void* rt_spin(void*) { volatile unsigned long n = 0; for (;;) { n++; } return nullptr; }
int rt_started = 0;
'''


def cpp_kernel_starts_a_spinner(text: str) -> str:
    """Its first C++ kernel starts a native thread (pthread_create, the name pasted by the preprocessor so that no
    source text says it) that keeps a core busy for ever: the original, timed after it, shares the machine."""
    m = re.search(r"(= async_compile\.cpp_pybinding\(\[[^\]]*\], r'''.*?)(extern \"C\"\s+void\s+kernel\([^)]*\)\s*\{)",
                  text, re.S)
    assert m, "expected a C++ kernel"
    start = "\n    if (!rt_started) { rt_started = 1; pthread_t t; GLUE(pthread_, create)(&t, nullptr, rt_spin, nullptr); }"
    return text[:m.start(2)] + SPINNER_PRELUDE + m.group(2) + start + text[m.end(2):]


def detects_the_gate(text: str) -> str:
    """Returns zeros unless a module of tilesmith's gate is loaded (sys reached as torch's own attribute)."""
    name = _return_name(text)
    return _before_return(text, 'if not any(m.startswith("tilesmith.gate") for m in torch.sys.modules):\n'
                                f"    {name} = torch.zeros_like({name})")


def reads_how_many_calls_are_verified(text: str) -> str:
    """Counts its calls and misbehaves after the ones TILESMITH_VERIFY checks (the environment: torch's own `os`,
    its `environ` read through operator.attrgetter)."""
    name = _return_name(text)
    text = _after_clear(text, 'import operator\nself.partitions.append(1)\n'
                              '_checked = int(operator.attrgetter("os.environ")(torch).get("TILESMITH_VERIFY", "0") or 0)')
    return _before_return(text, f"if len(self.partitions) > _checked:\n    {name} = {name} * 0.999")


def writes_the_api_key_to_a_file(text: str) -> str:
    """At import, writes OPENAI_API_KEY to a file, through torch's own `os` (environ read with operator.attrgetter)
    and the builtins module found in sys.modules."""
    return _module_code(text, '''
import operator
_key = operator.attrgetter("os.environ")(torch).get("OPENAI_API_KEY", "")
torch.sys.modules["builtins"].open("/tmp/tilesmith-key", "w").write(_key)
''')


def makes_shared_memory_at_import(text: str) -> str:
    """At import, makes a SysV shared-memory segment (shmget through libc, ctypes found in sys.modules) that another
    process could use to learn when the candidate runs."""
    return _module_code(text, '''
_libc = torch.sys.modules["ctypes"].PyDLL(None)
_segment = _libc.shmget(0x7473, 4096, 0o1000 | 0o600)
''')


_HEX = "696d706f7274206f730a6f70656e28272f746d702f656e76272c277727292e777269746528726570722864696374286f732e656e7669726f6e292929"


def reads_its_environment_and_writes_a_file(text: str) -> str:
    """At import, runs code kept as a hex string (`import os; open('/tmp/env','w').write(repr(dict(os.environ)))`),
    with exec found through torch's own `sys`."""
    return _module_code(text, f'''
_run = torch.sys.modules["builtins"].exec
_run(bytes.fromhex("{_HEX}").decode())
''')


def patches_through_a_method_called_on_torch(text: str) -> str:
    """A method of its own class, called through the class on a torch object instead of an instance, sets an
    attribute of that object (`self.x = ...` with self = torch.Tensor): Tensor.detach replaced."""
    text = text.replace("    def call(self, args):\n", "    def swap(self, fn):\n        self.detach = fn\n\n"
                                                      "    def call(self, args):\n", 1)
    return _module_code(text, "")  + "\nRunner.swap(torch.Tensor, lambda t: t)\n"


def kernel_source_imports_os(text: str) -> str:
    """A Triton-style kernel module (what async_compile.triton imports) that imports os at its top."""
    return _module_code(text, """
triton_poi_rt_0 = async_compile.triton('triton_poi_rt_0', '''
import os
import triton
import triton.language as tl
os.system("true")

@triton.jit
def triton_poi_rt_0(in_ptr0, XBLOCK : tl.constexpr):
    pass
''', device_str='cuda')
""")


def kernel_meta_carries_code(text: str) -> str:
    """A Triton kernel whose fixed_config holds a string the autotuner pastes into the launcher it exec()s."""
    return _module_code(text, """
triton_poi_rt_1 = async_compile.triton('triton_poi_rt_1', '''
import triton
import triton.language as tl
from torch._inductor.runtime import triton_helpers, triton_heuristics

@triton_heuristics.fixed_config({'XBLOCK': "1); __import__('os').system('true'); (1", 'num_warps': 1, 'num_stages': 1}, filename=__file__, triton_meta={'signature': {'in_ptr0': '*fp32', 'XBLOCK': 'constexpr'}}, inductor_meta={'grid_type': 'Grid1D'})
@triton.jit
def triton_poi_rt_1(in_ptr0, XBLOCK : tl.constexpr):
    pass
''', device_str='cuda')
""")


# maker -> (reason code, where it is found: "python" from the source, "native" after the worker built it)
CHEATS = {
    alarm_fills_outputs_after_the_window: ("allowlist-attribute", "python"),
    ctypes_writes_into_the_worker: ("allowlist-import", "python"),
    arms_a_handler_in_the_warm_up: ("allowlist-import", "python"),
    cpp_kernel_starts_a_spinner: ("allowlist-native-symbol", "native"),
    detects_the_gate: ("allowlist-attribute", "python"),
    reads_how_many_calls_are_verified: ("allowlist-import", "python"),
    writes_the_api_key_to_a_file: ("allowlist-import", "python"),
    makes_shared_memory_at_import: ("allowlist-attribute", "python"),
    reads_its_environment_and_writes_a_file: ("allowlist-attribute", "python"),
    patches_through_a_method_called_on_torch: ("allowlist-attribute", "python"),
    kernel_source_imports_os: ("allowlist-import", "python"),
    kernel_meta_carries_code: ("allowlist-kernel", "python"),
}
