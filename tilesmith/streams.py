"""`from tilesmith.streams import side_by_side`: the path candidates and installed artifacts import side streams
by (the static screen allows exactly that import). It lives in tilesmith/replay/streams.py; this module hands
the name on, the same object."""

from tilesmith.replay.streams import side_by_side

__all__ = ["side_by_side"]
