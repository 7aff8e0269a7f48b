"""How tilesmith starts every process that runs code it did not write: the scrubbed environment and the OS
sandbox (sandbox.py, whose second stage stage.py runs by path), workers forked from an interpreter that has
already imported torch (forked.py, the deciding side; zygote.py), and the redaction of secret values
(secrets.py). Nothing is imported here: the stage and the zygote start in milliseconds."""
