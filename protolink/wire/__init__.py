"""The wire between the host and a sandbox server, shared by both and importing neither: the
generated gRPC code (``_pb``, from ``proto/``), the converters between messages and execution
types (:mod:`.convert`), the one translation of errors to statuses and back (:mod:`.status`),
the operations both sides perform (:mod:`.operations`) and root descriptions (:mod:`.roots`).
"""
