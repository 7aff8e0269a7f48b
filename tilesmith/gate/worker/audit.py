"""The gate worker's audit hook (PEP 578): the interpreter's own record of what Python code asks for, installed in
each worker before any candidate code runs there and never removable, refuses what no honest wrapper does and what
the red team's cheats were made of:

- the code, defaults or keyword defaults of one of the worker's own functions replaced in place (`fn.__code__ = ...`):
  the worker guard compares them after each request, but a swap that puts itself back before the request ends left
  nothing to find. Only the functions the worker calls once candidate code has run are protected (`protected`: its
  own modules' and those the worker guard records, by identity), never every function in the process: library code
  sets a function's defaults all the time on an honest load and launch path (`typing.NamedTuple` and
  `collections.namedtuple` set `__new__.__defaults__` on each class they make, and torch 2.11 makes one inside
  `_is_non_overlapping_and_dense_or_false` at call time; on an H100 every original of the MoE, a Llama-style
  decoder and GPT-2's training step failed in the gate with the hook refusing them all);
- the garbage collector's view of the heap (`gc.get_objects`, `get_referrers`, `get_referents`): how cheats found
  the worker's dispatch table, its reply pipe and the original's kernels;
- a profile or trace function (`sys.setprofile`, `sys.settrace`; `sys.monitoring` callbacks on 3.12): Python run
  at every call the worker makes, the reading of a sample's request included (a cheat computed its outputs there);
- another audit hook, which could watch what this one lets through.

Each refusal raises in the code that asked (PermissionError), and is reported on the worker's mark socket as a
datagram the deciding process reads after every reply (`b"!" + event`): swallowing the exception hides nothing.
What the hook is made of is out of reach: it is not kept anywhere Python can name, the heap walk that could find it
is refused, and everything it reads is an argument default of immutable values (a replaced code or default is
refused by the hook itself: its own identity is among those it protects). Where there is no mark socket (a test calling the ops in-process) it only refuses.

Not covered, and why: `sys._getframe` and frame attributes (the standard library reads frames for logging,
namedtuples and warnings: refusing them would reject honest code), ctypes (the static screen's part; the OS sandbox
bounds where it can reach), signal handlers (no audit event exists for them).
"""

from __future__ import annotations

import os
import sys
import types

REFUSED = frozenset({
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "sys.setprofile", "sys.settrace", "sys.monitoring.register_callback", "sys.addaudithook",
})
FUNCTION_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
# Set or deleted (Python raises no event for defaults set to None; the worker guard still compares them after each
# request).
CHANGES = frozenset({"object.__setattr__", "object.__delattr__"})
REFUSAL = b"!"  # the first byte of a refusal's datagram on the mark socket (a window mark is clock.WINDOW_MARK)


class Refused(PermissionError):
    """What the gate worker does not let candidate code do. A refused `sys.addaudithook` raises nothing in the caller
    (Python drops the new hook and the exception); it is reported like the others."""


def own_functions(modules, extra=()) -> frozenset:
    """The identities of the functions defined in `modules` (at module level and in their classes) and of the
    functions among `extra`: what the hook protects (`install`). The worker keeps every one of them alive, so no
    other function can take one's identity while it runs."""
    fns = [v for v in extra if isinstance(v, types.FunctionType)]
    for mod in modules:
        for value in list(vars(mod).values()):
            if isinstance(value, types.FunctionType):
                fns.append(value)
            elif isinstance(value, type) and getattr(value, "__module__", "") == mod.__name__:
                fns += [v for v in vars(value).values() if isinstance(v, types.FunctionType)]
    return frozenset(map(id, fns))


def install(mark_fd: int, protected: frozenset = frozenset()) -> None:
    """Add the hook to this process for good (there is no way to remove an audit hook). Call it once, after the
    worker's own setup and before the first candidate code. `protected`: identities of the functions whose code
    and defaults may not change from now on (own_functions)."""

    def hook(event, args, _refused=REFUSED, _changes=CHANGES, _attrs=FUNCTION_ATTRS, _fn=types.FunctionType, _type=type,
             _id=id, _protected=frozenset(protected), _write=os.write, _exit=os._exit, _fd=mark_fd, _mark=REFUSAL,
             _error=Refused):
        if event in _refused:
            pass
        elif event in _changes and _type(args[0]) is _fn and args[1] in _attrs and _id(args[0]) in _protected:
            event = event + " " + args[1]
        else:
            return
        if _fd >= 0:
            try:
                _write(_fd, _mark + event.encode())
            except OSError:  # the socket filled or made non-blocking by candidate code: the worker ends, unreported
                _exit(70)     # refusals are not an option (the parent sees it crash)
        raise _error(f"the gate worker refuses {event}: candidate code may not replace the code of the worker's own "
                     "functions, walk the heap, set a profile or trace function, or add an audit hook")

    # The hook protects itself too: its identity joins the set before it is added (no event is refused before).
    names = hook.__code__.co_varnames[:hook.__code__.co_argcount]
    defaults = list(hook.__defaults__)
    defaults[names.index("_protected") - (len(names) - len(defaults))] = frozenset(protected) | {id(hook)}
    hook.__defaults__ = tuple(defaults)
    sys.addaudithook(hook)


def refusals(datagrams: list[bytes]) -> list[str]:
    """The events named by refusal datagrams (the deciding process's side)."""
    return [d[len(REFUSAL):].decode("ascii", "replace")[:80] for d in datagrams if d.startswith(REFUSAL)]
