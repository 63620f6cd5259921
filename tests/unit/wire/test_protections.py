"""The server's refusal as the host reads it back, and the one seccomp profile both sides use."""

from __future__ import annotations

import json

from protolink.wire.protections import parse_refusal, refusal, seccomp_profile


def test_the_host_reads_back_every_missing_protection_from_the_servers_last_lines():
    missing = {"capabilities": "CapEff: NET_RAW; CapBnd: NET_RAW", "network": "interfaces eth0"}
    output = "sandbox: INFO starting\n" + refusal(missing) + "\n"
    assert parse_refusal(output) == missing


def test_only_a_refusal_line_names_missing_protections():
    assert parse_refusal("sandbox: ERROR something else\nTraceback (most recent call last):\n") is None
    assert parse_refusal(refusal({"seccomp": "x"}).replace("}", "")) is None
    assert parse_refusal(refusal({}).replace("{}", '["seccomp"]')) is None


def test_the_profile_is_dockers_format_and_denies_by_default():
    profile = json.loads(seccomp_profile())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert {"ptrace", "mount", "unshare"}.isdisjoint(name for rule in profile["syscalls"] for name in rule["names"])
