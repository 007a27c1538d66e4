"""Data plane: episode files, feature caches, datasets and their I/O accounting.

``ground.geometry`` and ``cache.prefetch`` are pure Python (the control plane's preflight imports
them); every other module may import torch.
"""
