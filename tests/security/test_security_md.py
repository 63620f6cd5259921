"""SECURITY.md's table of attacks is exactly the corpus this directory runs."""

from __future__ import annotations

from .corpus import SECURITY_MD, cases, documented_table, table

MINIMUM_CASES = 40


def test_every_corpus_test_documents_its_attack_and_outcome():
    found = cases()
    assert len(found) >= MINIMUM_CASES
    assert len({case.test_id for case in found}) == len(found)


def test_security_md_lists_exactly_the_corpus():
    documented = documented_table(SECURITY_MD.read_text())
    assert documented == table(), "regenerate the table: python -m tests.security.corpus --write"
