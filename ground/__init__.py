"""The ground both planes stand on: what the control plane (``idmctl/``) and the data plane
(``cache/``, ``trainers/``) share, and nothing else.

- ``spec``      the experiment spec: schema, ``extends:`` loading, canonical hash
- ``contract``  the job↔trainer contract: exit codes, ``IDMCTL_*`` variables, run-directory files,
                the code version
- ``tracking``  MLflow experiment, tag, param and metric names
- ``geometry``  cache geometry: bytes per sample for a layer/frame selection
- ``run_dir``   a run directory's ``spec.json``
- ``startup``   a heavy process's start with the garbage collector off until it is set up
- ``units``, ``paths``, ``errors``

Imports point one way: ``ground`` imports nothing of ``idmctl``, ``cache`` or ``trainers``; the data
plane imports ``ground`` and never ``idmctl``; ``idmctl`` stands on both (tests/test_architecture.py).
No torch, mlflow or lightning at import time.
"""
