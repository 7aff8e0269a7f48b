"""Hand-written rewrites for the agent tests: what a scripted "model" writes into its attempt.

slow_two_matmuls (tests/fixtures/slow_two_matmuls.py) compiles to one scalar C++ kernel computing
relu(relu(x @ w1) @ w2) as broadcast-multiply-sum loops. Two distinct genuine wins, in order:
1. the same graph compiled with vectorisation on (the fixture's --vectorized wrapper);
2. no C++ kernel at all: two extern mm calls and in-place relus (`all_extern`).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.fakes.chat import ai, first_human

FIXTURE = Path(__file__).parent / "fixtures" / "slow_two_matmuls.py"


KERNEL_CALL = re.compile(r"^        (cpp_fused_\w+)\((buf\d+), arg0_1, arg1_1, arg2_1, (buf\d+)\)$", re.M)


def all_extern(text: str) -> str:
    m = KERNEL_CALL.search(text)
    assert m, "expected the fused kernel call of slow_two_matmuls"
    y, t = m.group(2), m.group(3)
    return text.replace(m.group(0), f"        extern_kernels.mm(arg0_1, arg1_1, out={t}); torch.relu_({t})\n"
                                    f"        extern_kernels.mm({t}, arg2_1, out={y}); torch.relu_({y})", 1)


def reads_api_key(text: str) -> str:
    """A cheat the gate's static screen rejects: the candidate reads the environment."""
    return text + "\n_key = os.environ.get('OPENAI_API_KEY')\n"


class Script:
    """Main-agent steps in order (callables of the messages, or messages); subagent calls are answered
    by `sub(messages)`. Main calls are sequential (the main agent waits on `task`), so one iterator works."""

    def __init__(self, main: list, sub=None):
        self.main, self.sub, self.seen = iter(main), sub, []

    def __call__(self, messages, n):
        if first_human(messages).startswith("SUBTASK"):
            return self.sub(messages)
        step = next(self.main, None)
        if step is None:
            return ai("nothing more to try")
        msg = step(messages) if callable(step) else step
        self.seen.append(msg)
        return msg
