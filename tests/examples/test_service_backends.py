"""examples/service_backends.py runs offline and exercises all five backends."""

from __future__ import annotations

from .example_runner import run_example


def test_service_backends_example_runs_offline():
    output = run_example("service_backends.py")
    assert '"body": "Grüße aus Zürich!\\nDie Präsentation ist im Anhang."' in output
    assert 'HTML-only: {"body": "", "html_body_omitted": true}' in output
    assert '"draft_id": "r-5837261940182736451"' in output
    assert 'filtered page: [["Company offsite", true]]' in output
    assert "a token reused with other arguments is refused" in output
    assert '"timeZone": "UTC"' in output and 'sent: {"status": "accepted"}' in output
    assert '"status": "partially_accepted"' in output and '"code": 550' in output
    assert "UIDVALIDITY changed" in output
    assert "ya29" not in output  # tokens never reach previews or results
