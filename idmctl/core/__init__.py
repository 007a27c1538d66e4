"""The vocabulary every floor speaks: the cluster profile, check results, the executor protocol.

Nothing here opens the store, runs a scheduler command or imports the heavy libraries.
"""
