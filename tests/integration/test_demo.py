"""`owngate demo` starts, prints a working key and snippet and the admin API with a token
per role, serves, and stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest


def _read_banner(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    stdout = proc.stdout

    def pump() -> None:
        for line in stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    text = ""
    deadline = time.monotonic() + timeout
    while "Ctrl-C stops everything" not in text and time.monotonic() < deadline:
        try:
            text += lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                break
    return text


def test_demo_end_to_end() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", "--port", "0"],
        # the demo sets a placeholder OPENAI_API_KEY for its own gateway only
        env={k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = _read_banner(proc)
        url = re.search(r"running at (http://\S+)", banner)
        key = re.search(r"demo API key \(shown once\):\s+(og-\S+)", banner)
        eu_key = re.search(r"EU tenant key \(shown once\):\s+(og-\S+)", banner)
        assert url and key and eu_key, banner
        assert "curl -s" in banner and "from openai import OpenAI" in banner
        client = openai.OpenAI(base_url=f"{url[1]}/v1", api_key=key[1], max_retries=0)
        reply = client.chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "Hello!"}]
        )
        assert reply.choices[0].message.content
        assert {m.id for m in client.models.list()} >= {"llama-3.1-8b", "gpt-4o-mini"}
        # Hosted only, and the demo tenant's policy allows it: served through LiteLLM.
        hosted = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello!"}]
        )
        assert hosted.choices[0].message.content
        eu = openai.OpenAI(base_url=f"{url[1]}/v1", api_key=eu_key[1], max_retries=0)
        assert "gpt-4o-mini" not in {m.id for m in eu.models.list()}
        with pytest.raises(openai.PermissionDeniedError, match="policy demo-eu/residency"):
            eu.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello!"}]
            )
        eu.close()
        assert "x-owngate-receipt" in reply_headers(url[1], key[1])
        check_admin_api(banner)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    audit = re.search(r"owngate audit verify (\S+) --key (\S+)", banner)
    assert audit, banner
    verified = subprocess.run(
        [sys.executable, "-m", "gateway", "audit", "verify", audit[1], "--key", audit[2]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr


def check_admin_api(banner: str) -> None:
    """The admin URL and role tokens the banner prints work, each within its role."""
    admin = re.search(r"Admin API .* at (http://127\.0\.0\.1:\d+)\n", banner)
    tokens = dict(
        re.findall(r"(operator|security|auditor) token \(shown once\):\s+(og-admin-\S+)", banner)
    )
    assert admin and set(tokens) == {"operator", "security", "auditor"}, banner
    assert f"{admin[1]}/openapi.json" in banner and f"{admin[1]}/log/" in banner

    def get(path: str, role: str) -> httpx.Response:
        headers = {"authorization": f"Bearer {tokens[role]}"}
        return httpx.get(f"{admin[1]}{path}", headers=headers, timeout=10)

    status = get("/admin/v1/status", "operator")
    assert status.status_code == 200, status.text
    assert {b["id"] for b in status.json()["backends"]} >= {"gpu-vllm", "cpu-llamacpp"}
    refused = get("/admin/v1/status", "auditor")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "permission_denied"
    assert get("/admin/v1/policies", "security").status_code == 200
    # validated against the environment the demo's gateway runs with (its OPENAI_API_KEY)
    hosted = {
        "id": "openai",
        "kind": "hosted",
        "provider": "openai",
        "api_key_env": "OPENAI_API_KEY",
        "base_url": "http://127.0.0.1:9/v1",
        "owner": "provider",
        "region": "eu-west-1",
        "retention": {"days": 0, "zero_data_retention": True},
        "models": [{"name": "gpt-4o-mini", "provider_model": "openai/gpt-4o-mini"}],
    }
    candidate = {"backends": [hosted], "tenants": [{"id": "t", "models": ["*"]}]}
    validated = httpx.post(
        f"{admin[1]}/admin/v1/config/validate",
        headers={"authorization": f"Bearer {tokens['operator']}"},
        json={"yaml": json.dumps(candidate)},
        timeout=10,
    )
    assert validated.json() == {"valid": True, "problems": []}, validated.text
    checkpoint = get("/log/checkpoint", "auditor")
    assert checkpoint.status_code == 200
    assert checkpoint.text.startswith("owngate-demo/log\n")


def reply_headers(url: str, key: str) -> dict[str, str]:
    response = httpx.post(
        f"{url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert response.status_code == 200
    return dict(response.headers)
