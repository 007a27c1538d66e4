"""Vocabulary without I/O: the job options as typed values."""
