"""Warnings from the library floors, which never print (only the command line does): a warning goes to
the ``idmctl`` logger. The command line configures no handler, so Python's last-resort handler writes
the message alone to stderr, as a console print did.

The message is scrubbed of the environment's credentials first: warnings quote exceptions from MLflow
and database drivers, which may hold a tracking or store URL with its password.
"""

from __future__ import annotations
from ground.redact import scrub_environment

LOGGER = "idmctl"


def warn(message: str) -> None:
    """Say ``message`` (``warning: …``, one line) without stopping the command."""
    import logging  # only when there is something to say: importing logging costs every command start-up

    logging.getLogger(LOGGER).warning(scrub_environment(message))
