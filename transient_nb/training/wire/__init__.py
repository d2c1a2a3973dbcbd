"""The PS data plane: the bytes of push, pull and push_pull, and their replies.

The Dask actor keeps the control (membership, versions, checkpoints, recovery); the gradients and
weights travel on a connection of their own between each trainer and each PS shard: a Unix domain
socket in a private folder when both share a host, mutually authenticated TLS with the cluster's
certificates across hosts. :mod:`.frame` is the message format, :mod:`.transport` how a
connection is made and secured, :mod:`.server` the PS's end, :mod:`.client` the trainer's.
"""
