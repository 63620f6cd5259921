"""Placements: pure translations of a :class:`~protolink.sandbox.config.SandboxConfig` into
what one orchestrator runs.

Each placement is a module with a function from the configuration and the facts of its own
orchestrator (what that orchestrator reports about itself, and what the host prepared) to that
orchestrator's specification. No I/O: the caller asks the orchestrator, makes the host's
directories, then translates, so every security default is checked without an engine.

- :mod:`.docker`: a Docker Engine container (the keywords of the docker SDK's
  ``containers.create``), run by :class:`~protolink.sandbox.docker.DockerSandbox`.
- :mod:`.kubernetes`: a Kubernetes Pod and its NetworkPolicy (plain manifests), printed by
  ``protolink-sandbox kube-manifest``.
- :mod:`.swarm`: a Docker Swarm service of one task (the keywords of the docker SDK's
  ``APIClient.create_service``); not placed by the service yet (docs/swarm.md).
- :mod:`.server`: what each runs alike (the server's arguments, mount points, capabilities).

Each reads the same configuration and is tested field by field.
"""
