"""Canonical source, graph keys and the FX header."""

from tilesmith import source

WRAPPER = """# AOT ID: ['3_forward']
from ctypes import c_void_p
# kernel path: /tmp/torchinductor_root/ab/cabcdef.py
_tensor_constant0 = None  # device(type='cpu') torch.float32 (64,) (1,) 7f2cbfe80d20
def call(args):
    pass
"""


def test_canonical_source_drops_process_specific_noise_and_stays_stable():
    other = WRAPPER.replace("3_forward", "0_forward").replace("7f2cbfe80d20", "7f00000000aa").replace(
        "torchinductor_root/ab/cabcdef", "torchinductor_bob/ab/cabcdef")
    a, b = source.canonicalize(WRAPPER), source.canonicalize(other)
    assert a == b and "['<n>_forward']" in a and "<kernel-path>" in a and "<hash>" in a
    assert source.canonicalize(a) == a


def test_graph_key_depends_on_source_and_environment():
    canon = source.canonicalize(WRAPPER)
    k = source.graph_key(canon, {"torch": "2.13"})
    assert len(k) == 64 and k != source.graph_key(canon, {"torch": "2.11"})
    assert k != source.graph_key(canon.replace("pass", "return []"), {"torch": "2.13"})


def test_fx_header_round_trips_and_does_not_change_the_key():
    fx = "graph():\n    %x : [num_users=1] = placeholder[target=x]\n\n    return (x,)"
    text = source.add_header(fx, WRAPPER)
    got_fx, got_src = source.split_header(text)
    assert got_src == WRAPPER and got_fx.strip() == fx.strip()
    assert source.key_of_text(text, {}) == source.key_of_text(WRAPPER, {})
    assert source.split_header(WRAPPER) == ("", WRAPPER)
