"""Preflight: the mandatory gate before any submission.

One module per check (``spec``, ``introspection``, ``loader``, ``shm``, ``io``, ``qos``, ``disk``,
``cache``, ``smoke``), each a function of the spec, the cluster profile and measurements;
``runner`` gathers and runs them; ``admission`` judges a job at submit. ``idmctl.record.preflights``
stores the results and holds the gate ``require_pass``.
"""
