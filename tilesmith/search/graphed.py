"""The whole call replayed from a CUDA graph, as a candidate: the lines that make a wrapper replay itself
(`call = graphed(call)`, the lean replay of tilesmith/replay/), and the labels such candidates carry, which the
tuner, the re-lowering search and the report share."""

from __future__ import annotations

GRAPHED_LABEL = "whole call replayed from a CUDA graph (tilesmith.cudagraph)"
GRAPHED_IMPORT = "from tilesmith.cudagraph import graphed"
_GRAPHED_TAIL = ("\n\n# tilesmith: this wrapper's launches replayed from a CUDA graph on the caller's stream, inputs\n"
                 f"# read in place where they stay put (tilesmith/cudagraph.py)\n{GRAPHED_IMPORT}\ncall = graphed(call)\n")
GRAPHED_OVER_INDUCTOR_LABEL = ("whole call replayed by tilesmith.cudagraph instead of Inductor's CUDA graphs "
                               "(the runtime turns reduce-overhead's replay off for this graph)")
REPLAYED_SUFFIX = " + whole call replayed (tilesmith.cudagraph)"  # a re-lowered variant replayed as well (relower.py)


def graphed_text(text: str) -> str:
    """The wrapper with its call(args) replayed from a CUDA graph (once: already graphed stays as is)."""
    return text if GRAPHED_IMPORT in text else text.rstrip("\n") + _GRAPHED_TAIL
