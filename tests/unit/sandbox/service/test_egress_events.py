"""A sandbox's egress decisions reach the service's sinks as ``egress`` events of that sandbox."""

from __future__ import annotations

from protolink.sandbox.egress.events import EgressEvent
from protolink.sandbox.service.config import Overrides, Template
from protolink.sandbox.service.events import Events, ServiceEvent
from protolink.sandbox.service.placement import egress_events
from protolink.sandbox.service.sandboxes import new_placed


class _Recorded(list):
    def record(self, event: ServiceEvent) -> None:
        self.append(event)


def test_a_decision_is_an_egress_event_of_the_sandbox_with_the_proxys_fields():
    recorded = _Recorded()
    placed = new_placed("0123abcd", "tenant-1", Template(name="default", image="img"), Overrides())
    egress_events(Events([recorded]), placed)(EgressEvent(
        sandbox="proxy-name", kind="denied", host="example.com", port=443, address=None, bytes_up=0, bytes_down=0,
        duration_seconds=0.0, reason="host example.com is not allowed", method="CONNECT"))
    (event,) = recorded
    assert (event.kind, event.tenant, event.sandbox) == ("egress", "tenant-1", "0123abcd")
    assert event.fields["decision"] == "denied" and event.fields["host"] == "example.com"
    assert event.fields["reason"] == "host example.com is not allowed" and "sandbox" not in event.fields
