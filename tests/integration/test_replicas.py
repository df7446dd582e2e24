"""Gateway replicas as real processes sharing a real Redis: `owngate serve` (three, and one
more to kill), one
`owngate sim` slow enough to hold streams open, a private `redis-server`.

What must hold across replicas (issues 4 and 6): one global in-flight view that routing
acts on; one global rate limit; a killed replica's in-flight counts and concurrency
slots stop counting once its lease runs out; Redis going away costs no request (no 5xx),
shows as degraded in /readyz and /metrics, and heals when Redis returns; a key revoked
with `owngate keys revoke` is refused by every replica.

Routing here is `least_inflight`, the strategy that reads only the gateway's in-flight
counts: both backends are the same simulator, so its scraped load cannot tell them apart
and only the shared counters can steer a request away from the loaded one.
"""

from __future__ import annotations

import functools
import math
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.routing.prometheus import parse_metrics
from gateway.tenants import add_key_hash, hash_api_key
from tests.helpers.gateways import ADMIN, ADMIN_HEADERS, readiness
from tests.helpers.net import free_port
from tests.helpers.prerequisites import redis_binary
from tests.helpers.processes import ServerProcess, owngate_argv
from tests.helpers.redis_server import RedisServer
from tests.helpers.waiting import until

pytestmark = pytest.mark.redis

SYNC_S = 0.05
LEASE_TTL_S = 1.5
RPM = 60  # tenant `metered`: a burst of 60, then one a second, over all replicas together
CONCURRENT = 4  # tenant `narrow`: requests in flight at once, over all replicas together
KEYS = {
    "acme": "og-replicas-acme-key-0123456789",
    "metered": "og-replicas-metered-key-0123456",
    "narrow": "og-replicas-narrow-key-01234567",
    "busy": "og-replicas-busy-key-0123456789",
    "leaving": "og-replicas-leaving-key-012345",
}
HOLD_TOKENS = 2000  # at 20 tokens/s a held stream would last 100 s; tests close them first


def _config(replica: str, port: int, sim_url: str, redis_url: str) -> dict[str, Any]:
    limits: dict[str, dict[str, int]] = {
        "acme": {},
        "metered": {"requests_per_minute": RPM},
        "narrow": {"concurrent_requests": CONCURRENT},
        "busy": {"requests_per_minute": 100_000, "concurrent_requests": 1_000},
        "leaving": {},
    }
    backends = [
        # `m-a` reaches backend a only: a way to load it from one replica on purpose.
        {"id": "a", "models": [{"name": "m", "aliases": ["m-a"]}]},
        {"id": "b", "models": [{"name": "m"}]},
    ]
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "state": {
            "backend": "redis",
            "url": redis_url,
            "key_prefix": "replicas",
            "replica_id": replica,
            "sync_interval_s": SYNC_S,
            "lease_ttl_s": LEASE_TTL_S,
            "timeout_ms": 2000,  # a busy 2-core test machine must not fall back by accident
        },
        "routing": {"default": {"strategy": "least_inflight"}},
        "backends": [
            {**b, "kind": "vllm", "base_url": sim_url, "region": "eu", "owner": "t"}
            for b in backends
        ],
        "keys_file": "keys.yaml",
        "tenants": [
            {"id": tenant, "api_key_hashes": [], "models": ["*"], "limits": limit}
            for tenant, limit in limits.items()
        ],
        "admin": ADMIN,
    }


class Cluster:
    """One simulator and gateway replicas sharing one Redis, as processes; `live` are
    the replicas not killed."""

    def __init__(self, redis: RedisServer, workdir: Path) -> None:
        self.redis = redis
        self.workdir = workdir
        self._started: list[ServerProcess] = []
        self.live: list[ServerProcess] = []
        for tenant, key in KEYS.items():
            add_key_hash(workdir / "keys.yaml", tenant, hash_api_key(key))
        port = free_port()
        argv = ["sim", "--kind", "vllm", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--model", "m", "--decode-tps", "20"]
        self.sim = self._start("sim", owngate_argv(*argv), port)

    def config_path(self, replica: str) -> Path:
        return self.workdir / f"{replica}.yaml"

    def add(self, *replicas: str) -> list[ServerProcess]:
        """Start replicas together; back once each is ready and sees every live peer."""
        added = []
        for replica in replicas:
            port = free_port()
            config = _config(replica, port, self.sim.url, self.redis.url)
            path = self.config_path(replica)
            path.write_text(yaml.safe_dump(config))
            added.append(self._start(replica, owngate_argv("serve", "--config", str(path)), port))
        self.sim.wait_ready("/health", 30.0)
        for gateway in added:
            gateway.wait_ready("/readyz", 30.0)
        self.live += added
        eventually_on(
            self.live,
            lambda g: (
                all(d["available"] for d in readyz(g)["backends"].values())
                and readyz(g)["state"]["replicas"] == len(self.live)
            ),
            f"sees the backends and {len(self.live)} replicas",
        )
        return added

    def kill(self, gateway: ServerProcess) -> None:
        """SIGKILL: no goodbye; its lease, counts and slots just stop being renewed."""
        self.live.remove(gateway)
        gateway.kill()

    def _start(self, name: str, argv: list[str], port: int) -> ServerProcess:
        service = ServerProcess(name, argv, self.workdir, port)
        self._started.append(service)
        return service

    def close(self) -> None:
        for service in reversed(self._started):
            service.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three replicas for the whole module (starting processes is the slow part): each
    test leaves them as it found them, or adds replicas of its own to kill."""
    workdir = tmp_path_factory.mktemp("replicas")
    redis = RedisServer(redis_binary(), workdir)
    redis.start()
    setup = Cluster(redis, workdir)
    try:
        setup.add("gw0", "gw1", "gw2")
        yield setup
    finally:
        setup.close()
        redis.stop()


# reading a gateway


def readyz(gateway: ServerProcess) -> dict[str, Any]:
    return readiness(gateway.url)


def backend(gateway: ServerProcess, backend_id: str) -> dict[str, Any]:
    detail: dict[str, Any] = readyz(gateway)["backends"][backend_id]
    return detail


def metric(gateway: ServerProcess, name: str, **labels: str) -> float:
    """The sum of a metric's samples that carry `labels`."""
    text = httpx.get(f"{gateway.url}/metrics", headers=ADMIN_HEADERS, timeout=10).text
    samples = parse_metrics(text).get(name, [])
    return sum(s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items()))


def served_by(gateway: ServerProcess) -> dict[str, float]:
    """Successful chat requests this gateway sent to each backend."""
    text = httpx.get(f"{gateway.url}/metrics", headers=ADMIN_HEADERS, timeout=10).text
    counts: Counter[str] = Counter()
    for sample in parse_metrics(text).get("owngate_requests_total", []):
        if sample.labels["status"] == "200":
            counts[sample.labels["backend"]] += int(sample.value)
    return dict(counts)


def eventually_on(
    gateways: list[ServerProcess],
    check: Callable[[ServerProcess], bool],
    what: str,
    within_s: float = 10.0,
) -> None:
    for gateway in gateways:
        until(functools.partial(check, gateway), f"{gateway.name}: {what}", timeout=within_s)


def chat_body(model: str, max_tokens: int = 1, stream: bool = False) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": "hello"}],
    }


def chat(
    client: httpx.Client, gateway: ServerProcess, tenant: str, model: str = "m"
) -> httpx.Response:
    return client.post(
        f"{gateway.url}/v1/chat/completions",
        json=chat_body(model),
        headers={"authorization": f"Bearer {KEYS[tenant]}"},
    )


# load


class HeldStreams:
    """`n` streams opened through the gateways (in turn) and held open until `close()`,
    or until the gateway serving them dies."""

    def __init__(self, gateways: list[ServerProcess], tenant: str, model: str, n: int) -> None:
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._answered = threading.Semaphore(0)
        body = chat_body(model, HOLD_TOKENS, stream=True)
        self._threads = [
            threading.Thread(target=self._hold, args=(gateways[i % len(gateways)], tenant, body))
            for i in range(n)
        ]
        for thread in self._threads:
            thread.start()
        for _ in range(n):
            assert self._answered.acquire(timeout=30), "a stream got no answer"

    def _hold(self, gateway: ServerProcess, tenant: str, body: dict[str, Any]) -> None:
        answered = False
        headers = {"authorization": f"Bearer {KEYS[tenant]}"}
        try:
            with (
                httpx.Client(timeout=30) as client,
                client.stream(
                    "POST", f"{gateway.url}/v1/chat/completions", json=body, headers=headers
                ) as response,
            ):
                self.statuses.append(response.status_code)
                answered = True
                self._answered.release()
                for _ in response.iter_raw():  # a chunk every 50 ms while decoding
                    if self._stop.is_set():
                        return
        except httpx.TransportError as exc:
            self.errors.append(repr(exc))
        finally:
            if not answered:
                self._answered.release()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


class Load:
    """Short chat requests from a few threads, spread over the gateways in turn: `total`
    of them, or fewer if `stop()` comes first. Records each answer's status."""

    def __init__(
        self, gateways: list[ServerProcess], tenant: str, total: int, threads: int
    ) -> None:
        self.answers: list[tuple[int, str | None]] = []  # status, error code
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._started = time.monotonic()
        self.elapsed = 0.0
        share = math.ceil(total / threads)
        self._threads = [
            threading.Thread(target=self._run, args=(gateways, tenant, n, share))
            for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, gateways: list[ServerProcess], tenant: str, offset: int, count: int) -> None:
        with httpx.Client(timeout=30) as client:
            for i in range(count):
                if self._stop.is_set():
                    return
                try:
                    response = chat(client, gateways[(i + offset) % len(gateways)], tenant)
                except httpx.TransportError as exc:
                    self.errors.append(repr(exc))
                    continue
                code = None if response.status_code == 200 else response.json()["error"]["code"]
                if response.status_code == 429:
                    assert response.headers["retry-after"].isdigit()
                self.answers.append((response.status_code, code))

    def join(self) -> Load:
        for thread in self._threads:
            thread.join(timeout=120)
        self.elapsed = time.monotonic() - self._started
        return self

    def stop(self) -> Load:
        self._stop.set()
        return self.join()

    @property
    def statuses(self) -> Counter[int]:
        return Counter(status for status, _ in self.answers)


# the tests


def test_two_gateways_share_one_inflight_view_and_route_on_it(cluster: Cluster) -> None:
    first, second = cluster.live[:2]
    served_before = served_by(second)
    streams = HeldStreams([first], "acme", "m-a", 6)
    try:
        assert streams.statuses == [200] * 6
        until(lambda: backend(first, "a")["inflight"] == 6, "first holds 6 on a")
        until(lambda: backend(second, "a")["peer_inflight"] == 6, "second sees them")
        assert backend(second, "a")["inflight"] == 0
        assert metric(second, "owngate_backend_peer_inflight", backend="a") == 6
        assert metric(second, "owngate_state_healthy") == 1
        assert metric(second, "owngate_state_replicas") == len(cluster.live)
        # Locally both backends are idle on `second`: without the shared view each of
        # these would go to a or b at random (all 12 to b by chance: 1 in 4096).
        with httpx.Client(timeout=30) as client:
            for _ in range(12):
                assert chat(client, second, "acme").status_code == 200
        served = served_by(second)
        assert served.get("a", 0) == served_before.get("a", 0)
        assert served["b"] == served_before.get("b", 0) + 12
    finally:
        streams.close()
    until(
        lambda: backend(second, "a")["peer_inflight"] == 0 == backend(first, "a")["inflight"],
        "closed streams leave both views",
    )


def test_three_gateways_keep_one_rate_limit_and_converging_counts(cluster: Cluster) -> None:
    gateways = cluster.live[:3]
    fallbacks = [metric(g, "owngate_state_fallbacks_total") for g in gateways]
    load = Load(gateways, "metered", total=150, threads=6).join()
    assert not load.errors
    assert set(load.answers) <= {(200, None), (429, "rate_limit_exceeded")}, load.statuses
    admitted = load.statuses[200]
    # GCRA: the burst of RPM, then one a second, whichever replica is asked.
    assert RPM <= admitted <= RPM + math.ceil(load.elapsed * RPM / 60) + 1, (admitted, load)
    # Every admission was decided on Redis, none on a replica's local share.
    assert [metric(g, "owngate_state_fallbacks_total") for g in gateways] == fallbacks

    streams = HeldStreams(gateways, "acme", "m-a", 6)  # two through each replica
    try:
        eventually_on(
            gateways,
            lambda g: backend(g, "a")["inflight"] == 2 and backend(g, "a")["peer_inflight"] == 4,
            "2 of its own and 4 of the others'",
        )
    finally:
        streams.close()
    eventually_on(
        gateways,
        lambda g: all(
            d["inflight"] == d["peer_inflight"] == 0 for d in readyz(g)["backends"].values()
        ),
        "every count back to 0",
    )


def test_a_killed_replica_stops_counting_when_its_lease_runs_out(cluster: Cluster) -> None:
    first, second = cluster.live[:2]
    (doomed,) = cluster.add("doomed")
    held = HeldStreams([doomed], "narrow", "m-a", CONCURRENT)  # all of narrow's slots
    load = Load([first, second], "acme", total=3000, threads=2)  # bounded; stopped below
    try:
        assert held.statuses == [200] * CONCURRENT
        until(lambda: backend(first, "a")["peer_inflight"] == CONCURRENT, "seen")
        with httpx.Client(timeout=30) as client:
            refused = chat(client, first, "narrow")
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"

            cluster.kill(doomed)
            eventually_on(
                cluster.live,
                lambda g: (
                    backend(g, "a")["peer_inflight"] == 0
                    and readyz(g)["state"]["replicas"] == len(cluster.live)
                ),
                "the dead replica's counts expire",
                within_s=LEASE_TTL_S + 10,
            )
            # Its slots expired too: the whole limit is there again, and still holds.
            again = HeldStreams([first, second], "narrow", "m-a", CONCURRENT)
            try:
                assert again.statuses == [200] * CONCURRENT
                assert chat(client, second, "narrow").status_code == 429
            finally:
                again.close()
    finally:
        load.stop()
        held.close()
    assert load.answers and not load.errors
    assert load.statuses == {200: len(load.answers)}  # the survivors served throughout


def test_redis_outage_costs_no_request_and_heals(cluster: Cluster) -> None:
    first, second, third = cluster.live[:3]
    held = HeldStreams([first], "acme", "m-a", 2)
    load = Load(cluster.live, "busy", total=6000, threads=3)  # bounded; stopped below
    try:
        until(lambda: backend(second, "a")["peer_inflight"] == 2, "shared before")
        cluster.redis.stop()
        before = len(load.answers)
        eventually_on(cluster.live, lambda g: not readyz(g)["state"]["healthy"], "degraded")
        for gateway in cluster.live:
            response = httpx.get(f"{gateway.url}/readyz", timeout=10)
            assert response.status_code == 200  # still ready: it serves on local state
            assert readyz(gateway)["state"]["degraded_reason"].startswith("redis ")
            assert metric(gateway, "owngate_state_healthy") == 0
        assert backend(second, "a")["peer_inflight"] == 0  # its own counts only
        until(lambda: len(load.answers) >= before + 30, "requests served meanwhile")
        assert metric(third, "owngate_state_fallbacks_total") > 0

        cluster.redis.start()  # same port, empty
        eventually_on(cluster.live, lambda g: readyz(g)["state"]["healthy"], "recovered")
        for gateway in cluster.live:
            assert metric(gateway, "owngate_state_healthy") == 1
        until(lambda: backend(second, "a")["peer_inflight"] == 2, "shared again")
    finally:
        if cluster.redis.process is None:
            cluster.redis.start()  # whatever failed, the next test gets its Redis back
        load.stop()
        held.close()
    assert not load.errors
    assert load.statuses == {200: len(load.answers)}  # no 5xx, no 429: Redis cost nothing
    assert held.statuses == [200, 200] and not held.errors


def test_keys_revoke_reaches_every_replica(cluster: Cluster) -> None:
    with httpx.Client(timeout=30) as client:
        for gateway in cluster.live:
            assert chat(client, gateway, "leaving").status_code == 200
        config = cluster.config_path(cluster.live[0].name)
        done = subprocess.run(
            owngate_argv("keys", "revoke", KEYS["leaving"], "--config", str(config)),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "revoked" in done.stderr and "Redis" in done.stderr
        keys_file = yaml.safe_load((cluster.workdir / "keys.yaml").read_text())
        assert keys_file["tenants"]["leaving"] == []
        assert hash_api_key(KEYS["acme"]) in keys_file["tenants"]["acme"]
        eventually_on(
            cluster.live,
            lambda g: chat(client, g, "leaving").status_code == 401,
            "refuses the revoked key",
        )
        for gateway in cluster.live:
            refused = chat(client, gateway, "leaving").json()
            assert refused["error"]["code"] == "invalid_api_key"
            assert refused["error"]["type"] == "invalid_request_error"
            assert chat(client, gateway, "acme").status_code == 200  # other keys still work
