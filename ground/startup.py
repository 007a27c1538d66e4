"""A heavy process's start without the cyclic garbage collector.

A trainer, cache builder or build job spends most of its start importing torch, Fabric, MLflow and
diffusers: ~540,000 objects that live as long as the process, which CPython's collector walks again and
again while they pile up. Off until the process has built what it works with, then those objects frozen
out of every later collection, the start costs less CPU: importing torch + Fabric + MLflow's SQLite store
took 4.8–5.0 s of user CPU with the collector and 3.7–4.0 s without, and a whole tiny trainer run 5.5–6.4 s
before and 3.6–3.9 s after (2026-12-04, 2 cores, 4 runs each). The price: the ~10,000 objects in
reference cycles that the imports leave behind (7.5 MB) are never freed.

``starting()`` goes at the top of a ``__main__``, before the heavy imports; ``settled()`` where the
process's loop begins. Called in a process that never called ``starting()`` (a library call from the
CLI or a test), ``settled()`` does nothing: that process's collector is left as it was.
"""

from __future__ import annotations

import gc

_deferred = False


def starting() -> None:
    """No collections until :func:`settled`: the imports and set-up that follow allocate, they free little."""
    global _deferred
    gc.disable()
    _deferred = True


def settled() -> None:
    """The set-up is over: keep what exists now out of every later collection, and collect again as usual."""
    global _deferred
    if _deferred:
        gc.freeze()
        gc.enable()
        _deferred = False
