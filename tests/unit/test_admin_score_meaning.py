"""What the admin API says a backend's routing score means is what routing does with it.

`/admin/v1/status` (the console's operator page, its "score" column) described
`scores` as "routing score per model (lower is better)", while the picker tries the
backend with the highest score first (`Picker.order` sorts by `-score`; `owngate status`
lists them highest first): an operator reading the console took the backend routing
prefers least for the one it prefers most. The schema now says higher is better."""

from __future__ import annotations

import random

from gateway.admin.app import openapi_schema
from gateway.admin.models import BackendStatus
from gateway.config.schema import PoolSettings, RoutingSettings
from gateway.routing.picker import Picker
from gateway.routing.registry import Registry
from gateway.routing.signals import BackendLoad
from tests.helpers.gateways import backend, gateway_config


def _unknown(backend_id: str) -> BackendLoad | None:
    return None  # nothing scraped: the gateway's own in-flight counts decide


def test_the_backend_tried_first_has_the_higher_score_and_the_schema_says_so() -> None:
    config = gateway_config(
        [backend(f"b{i}", f"http://127.0.0.1:{9000 + i}", "m") for i in range(2)]
    )
    routes = list(Registry.build(config, environ={}).routes["m"])
    routes[0].backend.inflight = 3  # busier: routing prefers b1
    picker = Picker(RoutingSettings(default=PoolSettings()), _unknown, random.Random(7))
    first = picker.order("m", routes, None)[0].backend
    pool = picker.pool("m")
    scores = {r.backend.id: picker.score(pool, r.backend, False) for r in routes}
    assert first.id == "b1"
    assert scores["b1"] > scores["b0"]
    described = BackendStatus.model_fields["scores"].description or ""
    assert "higher is better" in described, described
    published = openapi_schema()["components"]["schemas"]["BackendStatus"]
    assert "higher is better" in published["properties"]["scores"]["description"]
