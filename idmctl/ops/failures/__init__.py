"""Failure postmortems: classify every job that did not complete, keep its evidence and its fix."""
