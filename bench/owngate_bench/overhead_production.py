"""The production configuration: the overhead benchmark's `owngate+production` target.

Issue 16 names it: what a customer runs, as opposed to plain `owngate` (built-in policy,
no log, no access line). `write_production_config` writes `owngate-production.yaml`:

- the trust-policy set of `owngate+policy` (`overhead_policy.write_policy_dir`: EU only,
  zero retention, two data classes, a hosted EU fallback that is never used while a
  private backend is up);
- the provenance log on (`provenance:` with a generated Ed25519 key, default group
  commit and checkpoints): one signed record and one receipt per request, fsynced;
- `strategy: score` over two private simulators per model (each declared with
  `capacity.max_concurrency`, as docs/configuration.md asks), scraping their /metrics;
- the access log as operators run it: `logging: {format: json, level: info}` (the
  defaults), one JSON line per request on standard error, which the benchmark sends to
  a file (`.bench/overhead-run/owngate+production.log`), as a container runtime would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from owngate_bench.overhead_policy import HOSTED_KEY_ENV, POLICY_DIR, write_policy_dir
from owngate_bench.services import fresh_log_dir

__all__ = ["ORIGIN", "PRODUCTION", "write_production_config"]

PRODUCTION = "owngate+production"
ORIGIN = "bench.owngate/overhead-production"
_SLOTS = 256  # the simulator runs everything at once; declared so the scorer knows


def write_production_config(
    directory: Path,
    *,
    host: str,
    port: int,
    sims: Mapping[str, Sequence[int]],
    key_hash: str,
) -> Path:
    """Write the config, its policy directory, a fresh signing key and an empty log
    directory under `directory`; return the config's path. `sims` maps each model to
    the ports of its simulators (two each: score routing chooses between them)."""
    from gateway.provenance import write_signing_key  # the auditor's package, light

    write_policy_dir(directory)
    logdir = directory / "production-log"
    fresh_log_dir(logdir)  # a fresh log per run
    key_file = directory / "production-log.key"
    key_file.unlink(missing_ok=True)
    (directory / "production-log.vkey").write_text(write_signing_key(key_file, ORIGIN) + "\n")
    zero = "{days: 0, zero_data_retention: true}"
    lines = [
        f"listen: {{host: {host}, port: {port}}}",
        "logging: {format: json, level: info, access_log: true}",
        f"policy: {{paths: [{POLICY_DIR}]}}",
        "routing: {default: {strategy: score}}",
        # room for the seed load's ~460 open streams over two backends (default: 256 each)
        "limits: {max_connections_per_backend: 1024}",
        f"provenance: {{dir: '{logdir}', origin: {ORIGIN}, signing_key_file: '{key_file}'}}",
        "backends:",
    ]
    for model, ports in sims.items():
        for index, sim_port in enumerate(ports):
            lines.append(
                f"  - {{id: {model}-{'ab'[index]}, kind: vllm, "
                f"base_url: 'http://{host}:{sim_port}', models: [{{name: {model}}}], "
                f"region: eu-west-1, owner: bench, retention: {zero}, "
                f"capacity: {{max_concurrency: {_SLOTS}}}}}"
            )
    first = next(iter(sims))
    lines += [
        "  - {id: hosted-eu, kind: hosted, provider: openai, owner: openai,",
        f"     base_url: 'http://{host}:{sims[first][0]}/v1', api_key_env: {HOSTED_KEY_ENV},",
        f"     models: [{{name: {first}, provider_model: openai/{first}}}],",
        f"     region: westeurope, retention: {zero}}}",
        "tenants:",
        f"  - {{id: bench, api_key_hashes: ['{key_hash}'], models: ['*']}}",
        "admin: {allow_loopback: true, listen: null}",  # reads /admin/status; no admin API
    ]
    config = directory / "owngate-production.yaml"
    config.write_text("\n".join(lines) + "\n")
    return config


def backend_ids(sims: Mapping[str, Sequence[int]]) -> list[str]:
    """The private backends' ids in the config `write_production_config` writes."""
    return [f"{model}-{'ab'[i]}" for model, ports in sims.items() for i in range(len(ports))]
