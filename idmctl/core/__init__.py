"""The vocabulary every floor speaks: the cluster profile, check results, the executor protocol, the
job options as typed values.

Nothing here opens the store, runs a scheduler command or imports the heavy libraries.
"""
