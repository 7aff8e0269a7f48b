"""`from tilesmith.cudagraph import graphed`: the path candidates and installed artifacts import the lean
CUDA-graph replay by (the static screen allows exactly that import). It lives in tilesmith/replay/graphed.py;
this module hands its names on, the same objects."""

from tilesmith.replay.graphed import MAX_GRAPH_BYTES, MAX_LAYOUTS, MAX_RECORDS, ROTATE, Graphed, graphed

__all__ = ["graphed", "Graphed", "MAX_GRAPH_BYTES", "MAX_LAYOUTS", "MAX_RECORDS", "ROTATE"]
