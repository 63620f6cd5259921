"""The ProtoLink sandbox server, run inside the container: ``python3 -m protolink_sandboxd --help``.

A thin gRPC adapter over :mod:`protolink.execution` plus process supervision: commands run as
an unprivileged user in their own process groups, workspace and document operations run in
worker processes as that user (documents under hard limits), strays are killed, and the
server itself is non-dumpable so commands cannot ptrace it or read its memory.
"""
