"""The tokens file keeps digests, never tokens; quotas say why they refuse."""

from __future__ import annotations

import json
import stat

import pytest

from protolink.sandbox.service.tokens import Quota, Tokens, ensure_default


def test_a_token_is_shown_once_and_only_its_digest_is_kept(tmp_path):
    tokens = Tokens(tmp_path / "tokens.json")
    token = tokens.add("ci", Quota(sandboxes=2, memory_bytes=1 << 30, cpus=2.0))
    kept = (tmp_path / "tokens.json").read_text()
    assert token not in kept
    assert stat.S_IMODE((tmp_path / "tokens.json").stat().st_mode) == 0o600
    tenant = tokens.tenant(token)
    assert tenant is not None and tenant.name == "ci" and tenant.quota == Quota(2, 1 << 30, 2.0)
    assert tenant.id == json.loads(kept)["tokens"][0]["sha256"][:16]
    assert tokens.tenant(token + "x") is None and tokens.tenant("") is None


def test_a_second_reader_sees_tokens_added_later(tmp_path):
    reader = Tokens(tmp_path / "tokens.json")
    assert reader.tenant("anything") is None
    token = Tokens(tmp_path / "tokens.json").add("late")
    assert reader.tenant(token).name == "late"


def test_names_are_unique_and_printable(tmp_path):
    tokens = Tokens(tmp_path / "tokens.json")
    tokens.add("one")
    with pytest.raises(ValueError, match="exists already"):
        tokens.add("one")
    with pytest.raises(ValueError, match="printable name"):
        tokens.add("bad\nname")


def test_the_default_token_is_made_once(tmp_path):
    tokens = Tokens(tmp_path / "tokens.json")
    first = ensure_default(tokens, tmp_path / "default.token")
    assert ensure_default(tokens, tmp_path / "default.token") == first
    assert stat.S_IMODE((tmp_path / "default.token").stat().st_mode) == 0o600
    assert tokens.tenant(first) is not None


@pytest.mark.parametrize(("held", "why"), [
    ((3, 0, 0.0), "at most 2 sandboxes at once"),
    ((1, 2 << 30, 0.0), "at most 1024 MiB of memory in all sandboxes"),
    ((1, 0, 2.5), "at most 2 CPUs in all sandboxes"),
    ((2, 1 << 30, 2.0), None),
])
def test_a_quota_names_what_it_would_exceed(held, why):
    assert Quota(sandboxes=2, memory_bytes=1 << 30, cpus=2.0).refusal(*held) == why
