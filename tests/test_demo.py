"""`owngate demo` starts, prints a working key and snippet, serves, and stops on Ctrl-C."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time

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
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = _read_banner(proc)
        url = re.search(r"running at (http://\S+)", banner)
        key = re.search(r"demo API key \(shown once\):\s+(og-\S+)", banner)
        assert url and key, banner
        assert "curl -s" in banner and "from openai import OpenAI" in banner
        client = openai.OpenAI(base_url=f"{url[1]}/v1", api_key=key[1], max_retries=0)
        reply = client.chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "Hello!"}]
        )
        assert reply.choices[0].message.content
        assert {m.id for m in client.models.list()} >= {"llama-3.1-8b", "gpt-4o-mini"}
        with pytest.raises(openai.PermissionDeniedError, match="trust policy"):
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello!"}]
            )
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
