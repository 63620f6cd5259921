"""What a service offers: its templates, the host roots a sandbox may mount, and what a create
may change of a template.

The configuration file is TOML::

    default_template = "default"
    allowed_roots = ["/srv/data"]      # a create's roots must lie beneath one of these

    [templates.default]
    image = "protolink/sandbox:latest"
    memory_mib = 512
    cpus = 1.0
    pids = 256
    ttl_seconds = 3600                 # 0: no time to live
    idle_seconds = 600                 # 0: no idle timeout
    pool = 2                           # warm, never-used sandboxes kept ready
    allow = ["pypi.org:443"]           # egress; absent: no network at all
    runtime = "runsc"                  # the engine's runtime (gVisor); absent: the engine's default
    ca_file = "/etc/ssl/certs/ca-certificates.crt"  # a CA bundle its commands trust; not on Swarm
    node_labels = { zone = "eu" }      # on Swarm only: the nodes that may run it (constraints)

A template's ``ca_file`` is the operator's, as ``allowed_roots`` are: no create names a host file.
It is checked when the configuration is loaded (:func:`~protolink.sandbox.ca_file.read_ca_file`),
and each sandbox of the template, pooled or cold, gets a copy taken when it starts
(:attr:`SandboxConfig.ca_file <protolink.sandbox.config.SandboxConfig.ca_file>`), kept in its host
directory; Swarm nodes have no such copy, so a service with a ``[swarm]`` table refuses it.

With a ``[swarm]`` table the service places every sandbox on a Docker Swarm cluster
(docs/swarm.md): ``manager`` is a manager's engine, each node a gateway (``protolink-sandbox
gateway``) the service reaches with TLS, pinned by fingerprint, and the token in
``gateway_token_file``::

    [swarm]
    manager = "unix:///run/swarm-manager.sock"     # or tcp://HOST:PORT of a manager's engine
    gateway_token_file = "/etc/protolink/gateway-token"
    [swarm.nodes.node-1]                            # the node's hostname, as `docker node ls` shows it
    gateway = "10.0.0.11:7443"
    fingerprint = "sha256:..."                      # what the gateway printed

The ``[swarm]`` table may also come from a file of its own (``serve --swarm FILE``, ``up --swarm
FILE``), which replaces the configuration file's. Swarm placement keeps warm pools, makes
managed workspaces (on the task's node) and gives egress (decided at the service, carried through
the node's gateway) as the local one does; a create's roots must exist at the same paths on every node.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from protolink.errors import CaFileError, SandboxPermissionError
from protolink.wire.roots import Root

from ..ca_file import read_ca_file
from ..config import MiB, resolve_roots

DEFAULT_TEMPLATE = "default"


@dataclass(frozen=True)
class Template:
    """How a sandbox of this template starts unless a create says otherwise; ``pool`` is how
    many never-used ones are kept started; ``ca_file``, a host CA bundle its commands trust, no
    create changes."""

    name: str
    image: str
    memory_bytes: int = 512 * MiB
    cpus: float = 1.0
    pids: int = 256
    ttl_seconds: float | None = 3600.0
    idle_seconds: float | None = 600.0
    allow: tuple[str, ...] | None = None
    pool: int = 0
    runtime: str | None = None
    node_labels: tuple[tuple[str, str], ...] = ()
    ca_file: str | None = None

    @classmethod
    def from_table(cls, name: str, table: dict[str, Any], image: str) -> Template:
        known = {"image", "memory_mib", "cpus", "pids", "ttl_seconds", "idle_seconds", "allow", "pool", "runtime",
                 "node_labels", "ca_file"}
        if unknown := set(table) - known:
            raise ValueError(f"template {name!r}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        allow, node_labels = table.get("allow"), table.get("node_labels", {})
        if not isinstance(node_labels, dict) or not all(isinstance(v, str) and v for v in node_labels.values()):
            raise ValueError(f"template {name!r}: node_labels is a table of labels to non-empty strings")
        return cls(name=name, image=table.get("image", image), memory_bytes=int(table.get("memory_mib", 512)) * MiB,
                   cpus=float(table.get("cpus", 1.0)), pids=int(table.get("pids", 256)),
                   ttl_seconds=float(table.get("ttl_seconds", 3600)) or None,
                   idle_seconds=float(table.get("idle_seconds", 600)) or None,
                   allow=None if allow is None else tuple(map(str, allow)), pool=int(table.get("pool", 0)),
                   runtime=str(table["runtime"]) if "runtime" in table else None,
                   node_labels=tuple(sorted((str(key), value) for key, value in node_labels.items())),
                   ca_file=None if "ca_file" not in table else _checked_ca_file(name, table["ca_file"]))


def _checked_ca_file(template: str, path: Any) -> str:
    """``path``, the ``ca_file`` of template ``template``: an absolute path of a CA file
    :func:`~protolink.sandbox.ca_file.read_ca_file` takes (CaFileError naming the template if not)."""
    if not isinstance(path, str) or not os.path.isabs(path):
        raise ValueError(f"template {template!r}: ca_file must be an absolute path, got {path!r}")
    try:
        read_ca_file(path)
    except CaFileError as error:
        raise CaFileError(f"template {template!r}: {error}", path=error.path) from None
    return path


@dataclass(frozen=True)
class Overrides:
    """What a create changes of its template (None or empty: the template's own)."""

    image: str | None = None
    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = None
    allow: tuple[str, ...] | None = None
    ttl_seconds: float | None = None
    idle_seconds: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    roots: tuple[Root, ...] = ()
    workspace: bool = False

    @property
    def none(self) -> bool:
        """True when nothing is changed: such a create may take a pooled sandbox."""
        return self == Overrides()

    def applied(self, template: Template) -> Template:
        """``template`` with these overrides (its pool apart)."""
        changed = {f.name: getattr(self, f.name) for f in fields(self)
                   if f.name in {g.name for g in fields(Template)} and getattr(self, f.name) is not None}
        return replace(template, **changed, pool=0)


@dataclass(frozen=True)
class NodeGateway:
    """A Swarm node's gateway: its ``HOST:PORT`` and the fingerprint of its certificate."""

    address: str
    fingerprint: str


@dataclass(frozen=True)
class SwarmConfig:
    """Where sandboxes are placed on Swarm: a manager's engine (a docker URL), the gateway of each
    node by hostname, the file of the token the gateways take, how long a sandbox's task may
    take to run (it waits, pending, while no node has a slot), and how long a sandbox's Swarm
    service outlives the last renewal of its lease by the running service (then a manager's
    gateway removes it: :func:`~protolink.sandbox.leftovers.reap`)."""

    manager: str
    gateways: dict[str, NodeGateway]
    token_file: Path
    start_seconds: float = 120.0
    lease_seconds: float = 600.0

    def __post_init__(self) -> None:
        if not self.lease_seconds >= 3:
            raise ValueError(f"[swarm] lease_seconds must be 3 or more, got {self.lease_seconds}")

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> SwarmConfig:
        known = {"manager", "gateway_token_file", "nodes", "start_seconds", "lease_seconds"}
        if unknown := set(table) - known:
            raise ValueError(f"[swarm]: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        missing = {"manager", "gateway_token_file", "nodes"} - set(table)
        if missing:
            raise ValueError(f"[swarm] needs {', '.join(sorted(missing))}")
        gateways = {}
        for node, entry in table["nodes"].items():
            if not isinstance(entry, dict) or set(entry) != {"gateway", "fingerprint"}:
                raise ValueError(f"[swarm.nodes.{node}] needs exactly gateway and fingerprint")
            gateways[str(node)] = NodeGateway(str(entry["gateway"]), str(entry["fingerprint"]))
        timings = {key: float(table[key]) for key in ("start_seconds", "lease_seconds") if key in table}
        return cls(str(table["manager"]), gateways, Path(table["gateway_token_file"]), **timings)

    def token(self) -> str:
        """The token the gateways take; ValueError when its file is empty."""
        token = self.token_file.read_text().strip()
        if not token:
            raise ValueError(f"the gateway token file {self.token_file} is empty")
        return token


def load_swarm_table(path: Path) -> dict[str, Any]:
    """The ``[swarm]`` table of the TOML file ``path``, checked; ValueError when it has none or it
    does not hold."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ValueError(f"cannot read the Swarm file {path}: {error.strerror}") from None
    table = tomllib.loads(text).get("swarm")
    if not isinstance(table, dict):
        raise ValueError(f"{path} has no [swarm] table")
    SwarmConfig.from_table(table)
    return table


@dataclass(frozen=True)
class ServiceConfig:
    """Templates by name, the default one, the host directories sandboxes may mount, and the
    Swarm cluster that runs them (None: this host's engine)."""

    templates: dict[str, Template]
    default_template: str = DEFAULT_TEMPLATE
    allowed_roots: tuple[str, ...] = ()
    swarm: SwarmConfig | None = None

    def __post_init__(self) -> None:
        if self.default_template not in self.templates:
            raise ValueError(f"the default template {self.default_template!r} is not among the templates "
                             f"({', '.join(sorted(self.templates))})")
        for template in self.templates.values():
            if self.swarm is None and template.node_labels:
                raise ValueError(f"template {template.name!r}: node_labels place sandboxes on Swarm nodes; this "
                                 f"service has no [swarm] table")
            if self.swarm is not None and template.ca_file is not None:
                raise ValueError(f"template {template.name!r}: ca_file is not placed on Swarm: the service copies it "
                                 f"into a sandbox's directory on this host, which no node's sandbox sees")

    @classmethod
    def load(cls, path: Path | None, *, image: str, pool: int | None = None,
             swarm: Path | None = None) -> ServiceConfig:
        """The configuration in ``path`` (None: a default template only); ``image`` is a
        template's image unless it names one; ``pool`` replaces the default template's pool size;
        the ``[swarm]`` table of the file ``swarm`` replaces the configuration's."""
        data: dict[str, Any] = tomllib.loads(path.read_text()) if path is not None else {}
        if swarm is not None:
            data["swarm"] = load_swarm_table(swarm)
        default = data.get("default_template", DEFAULT_TEMPLATE)
        tables = data.get("templates") or {default: {}}
        templates = {name: Template.from_table(name, table, image) for name, table in tables.items()}
        if pool is not None and default in templates:
            templates[default] = replace(templates[default], pool=pool)
        allowed = tuple(os.path.realpath(str(root)) for root in data.get("allowed_roots", ()))
        swarm = SwarmConfig.from_table(data["swarm"]) if "swarm" in data else None
        return cls(templates, default, allowed, swarm)

    def template(self, name: str) -> Template:
        """The template ``name`` (empty: the default); ValueError naming the known ones."""
        found = self.templates.get(name or self.default_template)
        if found is None:
            raise ValueError(f"no template {name!r}; this service has {', '.join(sorted(self.templates))}")
        return found

    def checked_roots(self, roots: tuple[Root, ...]) -> tuple[Root, ...]:
        """``roots`` resolved, each beneath an allowed root; SandboxPermissionError otherwise."""
        resolved = resolve_roots(roots)
        for root in resolved:
            if not any(root.path == allowed or root.path.startswith(allowed.rstrip("/") + "/")
                       for allowed in self.allowed_roots):
                raise SandboxPermissionError(f"host root {root.path} is not beneath a root this service allows")
        return resolved
