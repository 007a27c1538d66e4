"""``idmctl notify --test``: check the notification URLs configured and send each one test message."""

from __future__ import annotations

from typing import Annotated

import typer

from ground.errors import CheckFailed
from idmctl.cli.commands import options
from idmctl.cli.output import console


def notify(
    test: Annotated[bool, typer.Option("--test", help="Send one test message to each configured URL.")] = False,
    cluster: options.Cluster = None,
) -> None:
    """The URLs sync and decide notify ($IDMCTL_NOTIFY, else the cluster profile's `notify`), masked. Exit 2
    for a URL apprise cannot use (naming where it is set), 1 when one does not take the test message."""
    from idmctl.ops.notify import send_test  # start-up: the profile and store modules only for this command

    sent = send_test(cluster, deliver=test)
    if sent.empty_reason:
        console.print(f"notify: no URL configured ({sent.empty_reason})", markup=False)
        return
    for target in sent.targets:
        verb = "sent a test message to" if test else "configured:"
        if target.where not in sent.failed_where:
            console.print(f"notify: {verb} {target.shown} ({target.where})", markup=False)
    if sent.failed_where:
        raise CheckFailed(f"error: {len(sent.failed_where)} of {len(sent.targets)} notification URLs did not take "
                          "the test message (the warnings above say why)")
