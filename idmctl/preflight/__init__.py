"""Preflight: the mandatory gate before any submission.

One module per check (``spec``, ``introspection``, ``loader``, ``shm``, ``io``, ``qos``, ``disk``,
``cache``, ``smoke``), each a function of the spec, the cluster profile and measurements;
``runner`` gathers and runs them; ``record`` stores results and holds the gate ``require_pass``.
"""
