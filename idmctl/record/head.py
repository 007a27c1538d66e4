"""The schema revision this code writes, importable without SQLAlchemy (the fast paths check it)."""

HEAD_REVISION = "0003"
"""Keep equal to the newest file in ``migrations/versions`` (tests/idmctl/record/test_store.py checks it)."""
