"""Data plane: episode files, feature caches, datasets and their I/O accounting.

``ground.geometry`` is pure Python (the control plane's preflight imports it); every other module
may import torch.
"""
