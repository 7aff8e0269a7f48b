"""The vetted helpers a candidate may import: the lean CUDA-graph replay (graphed.py, which decides when to
capture; record.py, one capture; native/, its address check in C) and side streams (streams.py).

Candidates and installed artifacts import them by their public paths, `from tilesmith.cudagraph import graphed`
and `from tilesmith.streams import side_by_side` (the static screen allows exactly these): thin modules that
hand these names on. Nothing is imported here, so `tilesmith.replay.native` loads no torch.
"""
