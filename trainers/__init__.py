"""Data plane: the layer-routed DiT, its Fabric trainer, evaluation and the smoke run."""
