"""idmctl: declarative experiments, preflight, Slurm submission and postmortems for IDM training.

The control plane. Nothing here imports torch, mlflow, lightning or diffusers at import time;
commands that need them import them inside the function body.
"""

__version__ = "0.1.0"
