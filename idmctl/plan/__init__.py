"""Arithmetic on the spec, the cluster profile and measurements: limits, budget, what-if, ETA and
efficiency. Planning decides numbers; it submits nothing."""
