"""`python -m tilesmith.gate.worker RESULT_FD [MARK_FD]`: a gate worker (serve.py)."""

import sys

from tilesmith.gate.worker import serve

if __name__ == "__main__":
    serve.main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else -1)
