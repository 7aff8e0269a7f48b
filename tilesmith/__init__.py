"""tilesmith: make the code TorchInductor generates faster, with proof.

Importing the package is cheap: it loads no torch._inductor, typer, rich, langchain or deepagents.
"""

from tilesmith.api import compile, last_run_id
from tilesmith.errors import TilesmithError

__version__ = "0.1.0"
__all__ = ["TilesmithError", "__version__", "compile", "last_run_id"]
