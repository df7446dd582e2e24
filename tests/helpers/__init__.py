"""What the tests share, in one place: test modules import from here, never from each other.

- `gateways`: in-process gateways and simulators built from plain dicts (keys, `backend`,
  `hosted_backend`, `gateway_config`, `readiness`, `served`...); the fixtures that start
  them are in tests/conftest.py.
- `processes`: `owngate serve` as a child process (`GatewayProcess`).
- `provenance`: reading a provenance log back (`records`, `request_records`), the auditor
  CLI in-process (`run_audit`), a failing disk (`FailingDisk`).
- `net`: `free_port`; `paths`: the repository root and the test vectors.
- `prerequisites`: what the `redis`, `real_backend` and `deploy_tools` markers need, and
  the failure naming the marker to deselect when it is absent.
- `raw_backend`, `raw_http`: scripted raw-socket backends and clients; `anthropic_mock`:
  Anthropic's Messages API on a real socket; `redis_server`: a private redis-server;
  `fuzz_rig`, `fuzz_inputs`: the HTTP fuzz suite's gateway and inputs; `real_backend/`:
  installing and running a real llama.cpp server.
"""
