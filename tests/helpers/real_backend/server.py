"""Install and run a real llama.cpp ``llama-server`` for integration tests.

:func:`install` runs ``setup.sh`` (idempotent, fast once installed) and returns the
paths it installed; :func:`running_llama_server` starts one server on a free
127.0.0.1 port, waits for ``/health`` to answer 200 and stops the whole process group
on exit. Both have bounded waits, so a wedged server fails a test instead of hanging CI.
:func:`probe` answers whether a binary really serves on this CPU; ``setup.sh`` runs it
as ``python server.py probe BINARY MODEL`` to choose between the prebuilt server and a
source build.

Stdlib only, so the helper also works from scripts and benchmarks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Installation",
    "LlamaServer",
    "RealBackendUnavailable",
    "ServerDidNotStart",
    "ask",
    "default_install_dir",
    "install",
    "probe",
    "probe_answer",
    "running_llama_server",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
SETUP_SCRIPT = Path(__file__).resolve().with_name("setup.sh")
INSTALL_DIR_ENV = "OWNGATE_REAL_BACKEND_DIR"
# The F16 rewrite of the Q4_1 file shipped in the wheel (gguf_to_f16.py): the prebuilt's
# quantized kernels answer nonsense on some CPUs, its F16 path does not.
SMOLLM2_FILE = "SmolLM2-135M-Instruct.F16.gguf"
# The known prompt a real instruct model must answer: setup.sh probes SmolLM2 with it.
KNOWN_QUESTION = "What is the capital of France?"
KNOWN_ANSWER = "Paris"
# Room for a cold source build (10-15 minutes on two cores) when the prebuilt server
# does not run on this CPU; with everything cached, setup.sh takes seconds.
INSTALL_TIMEOUT_S = 1800.0


class RealBackendUnavailable(RuntimeError):
    """The real server could not be installed here (no network, unsupported platform)."""


class ServerDidNotStart(RuntimeError):
    """``llama-server`` did not become healthy; ``exit_code`` is None when it still ran."""

    def __init__(self, message: str, exit_code: int | None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class Installation:
    """Paths written by ``setup.sh``."""

    root: Path
    server_binary: Path
    tiny_model: Path
    tiny_tokenizer_dir: Path
    smollm2_model: Path | None
    smollm2_tokenizer_dir: Path | None = None  # its tokenizer.json, with --with-smollm2


@dataclass(frozen=True, slots=True)
class LlamaServer:
    """A running server. ``base_url`` has no ``/v1`` suffix (``/health`` lives at the root)."""

    base_url: str
    alias: str
    port: int
    slots: int
    ctx_size: int
    model_path: Path
    log_path: Path
    pid: int


def default_install_dir() -> Path:
    """``$OWNGATE_REAL_BACKEND_DIR``, else ``.real-backend/`` at the repository root."""
    configured = os.environ.get(INSTALL_DIR_ENV)
    return Path(configured) if configured else REPO_ROOT / ".real-backend"


def install(
    dest: Path | None = None, *, with_smollm2: bool = False, timeout_s: float = INSTALL_TIMEOUT_S
) -> Installation:
    """Run ``setup.sh`` into ``dest`` and return what it installed.

    Raises :class:`RealBackendUnavailable` with the script's output when it fails.
    """
    root = (dest or default_install_dir()).resolve()
    cmd = ["bash", str(SETUP_SCRIPT), str(root)]
    if with_smollm2:
        cmd.append("--with-smollm2")
    # The generator needs gguf/tokenizers/numpy: the interpreter running the tests has them.
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    # Its own process group, so a timeout also stops a compiler it started.
    with subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            _stop(proc, 5.0)
            proc.communicate()
            raise RealBackendUnavailable(
                f"{SETUP_SCRIPT.name} took over {timeout_s:.0f} s"
            ) from exc
    if proc.returncode != 0:
        tail = "\n".join((stdout + stderr).splitlines()[-20:])
        raise RealBackendUnavailable(
            f"{SETUP_SCRIPT.name} exited {proc.returncode} installing into {root}:\n{tail}"
        )
    installation = Installation(
        root=root,
        server_binary=root / "bin" / "llama-server",
        tiny_model=root / "models" / "tiny" / "tiny-llama.gguf",
        tiny_tokenizer_dir=root / "models" / "tiny" / "tokenizer",
        smollm2_model=root / "models" / "smollm2" / SMOLLM2_FILE if with_smollm2 else None,
        smollm2_tokenizer_dir=root / "models" / "smollm2" / "tokenizer" if with_smollm2 else None,
    )
    for path in (installation.server_binary, installation.tiny_model, installation.smollm2_model):
        if path is not None and not path.is_file():
            raise RealBackendUnavailable(f"{SETUP_SCRIPT.name} succeeded but {path} is missing")
    return installation


@contextlib.contextmanager
def running_llama_server(
    installation: Installation,
    *,
    model: Path | None = None,
    alias: str = "tiny",
    slots: int = 4,
    ctx_size: int = 4096,
    threads: int = 1,
    log_dir: Path | None = None,
    extra_args: Sequence[str] = (),
    startup_timeout_s: float = 60.0,
    stop_timeout_s: float = 10.0,
) -> Iterator[LlamaServer]:
    """Start ``llama-server`` (default model: the tiny one) and yield it once healthy.

    ``ctx_size`` is the total context; llama.cpp splits it evenly across ``slots``.
    The server runs CPU-only (``--device none``) so results do not depend on a GPU
    being present, with ``--metrics`` on and the web UI off. Raises
    :class:`ServerDidNotStart` when it does not become healthy.
    """
    with _serving(
        installation.server_binary,
        model or installation.tiny_model,
        alias=alias,
        slots=slots,
        ctx_size=ctx_size,
        threads=threads,
        log_dir=log_dir or installation.root / "logs",
        extra_args=extra_args,
        startup_timeout_s=startup_timeout_s,
        stop_timeout_s=stop_timeout_s,
    ) as server:
        yield server


def probe(binary: Path, model: Path, *, log_dir: Path, timeout_s: float = 30.0) -> str | None:
    """None when ``binary`` serves ``model`` here (healthy, answers a one-token completion).

    Otherwise why not. Raises :class:`ServerDidNotStart` with ``exit_code`` None when the
    server neither became healthy nor exited within ``timeout_s``: no verdict.
    """
    try:
        with _serving(
            binary,
            model,
            alias="probe",
            slots=1,
            ctx_size=256,
            threads=1,
            log_dir=log_dir,
            startup_timeout_s=timeout_s,
            stop_timeout_s=5.0,
        ) as server:
            return _complete_one_token(server, timeout_s)
    except ServerDidNotStart as exc:
        if exc.exit_code is None:
            raise
        return str(exc)


def probe_answer(
    binary: Path, model: Path, *, log_dir: Path, timeout_s: float = 60.0
) -> str | None:
    """None when ``binary`` serving ``model`` answers :data:`KNOWN_QUESTION` at temperature
    0 with a reply that contains :data:`KNOWN_ANSWER`; otherwise why not (wrong kernels
    still serve, so a one-token probe cannot tell). Raises :class:`ServerDidNotStart`
    with ``exit_code`` None when the server neither became healthy nor exited in time."""
    try:
        with _serving(
            binary,
            model,
            alias="probe-answer",
            slots=1,
            ctx_size=512,
            threads=1,
            log_dir=log_dir,
            startup_timeout_s=timeout_s,
            stop_timeout_s=5.0,
        ) as server:
            try:
                reply = ask(server.base_url, KNOWN_QUESTION, timeout_s=timeout_s)
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as exc:
                return f"healthy, but the chat completion failed ({exc}); log {server.log_path}"
    except ServerDidNotStart as exc:
        if exc.exit_code is None:
            raise
        return str(exc)
    if KNOWN_ANSWER.lower() not in reply.lower():
        return f"asked {KNOWN_QUESTION!r} at temperature 0, it answered {reply[:200]!r}"
    return None


def ask(
    base_url: str,
    question: str,
    *,
    timeout_s: float,
    headers: dict[str, str] | None = None,
    model: str = "any",
) -> str:
    """The assistant's reply to ``question`` from ``base_url``/v1/chat/completions at
    temperature 0, 20 tokens at most (an OpenAI-compatible server or gateway)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 20,
    }
    request = urllib.request.Request(
        base_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with opener.open(request, timeout=timeout_s) as response:
        answer = json.loads(response.read())
    content = answer["choices"][0]["message"]["content"]
    if not isinstance(content, str):
        raise ValueError(f"no text in the answer: {str(answer)[:200]}")
    return content


@contextlib.contextmanager
def _serving(
    binary: Path,
    model_path: Path,
    *,
    alias: str,
    slots: int,
    ctx_size: int,
    threads: int,
    log_dir: Path,
    extra_args: Sequence[str] = (),
    startup_timeout_s: float,
    stop_timeout_s: float,
) -> Iterator[LlamaServer]:
    log_dir.mkdir(parents=True, exist_ok=True)
    problem, exit_code = "no attempt made", None
    # A free port can be taken between probing and binding; retry on a fresh one.
    for _attempt in range(3):
        port = _free_port()
        log_path = log_dir / f"llama-server-{alias}-{port}.log"
        argv = [
            str(binary),
            *("--model", str(model_path), "--alias", alias),
            *("--host", "127.0.0.1", "--port", str(port)),
            *("--parallel", str(slots), "--ctx-size", str(ctx_size), "--threads", str(threads)),
            *("--device", "none", "--metrics", "--no-webui"),
            *extra_args,
        ]
        # The prebuilt finds its libraries beside the real file, not beside a link to it.
        proc = _spawn(argv, log_path, binary.resolve().parent)
        try:
            base_url = f"http://127.0.0.1:{port}"
            why = _wait_healthy(proc, base_url, startup_timeout_s)
            if why is None:
                yield LlamaServer(
                    base_url=base_url,
                    alias=alias,
                    port=port,
                    slots=slots,
                    ctx_size=ctx_size,
                    model_path=model_path,
                    log_path=log_path,
                    pid=proc.pid,
                )
                return
            problem, exit_code = f"{why}; log {log_path}:\n{_tail(log_path)}", proc.poll()
            if "bind" not in _tail(log_path).lower():
                break
        finally:
            _stop(proc, stop_timeout_s)
    raise ServerDidNotStart(f"llama-server did not become healthy: {problem}", exit_code)


def _complete_one_token(server: LlamaServer, timeout_s: float) -> str | None:
    """None when ``/completion`` generates a token; the model and its kernels really run."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(
        server.base_url + "/completion",
        data=json.dumps({"prompt": "Hello", "n_predict": 1}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with opener.open(request, timeout=timeout_s) as response:
            body = json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as exc:
        return f"healthy, but a one-token completion failed ({exc}); log {server.log_path}:\n" + (
            _tail(server.log_path)
        )
    if not isinstance(body, dict) or "content" not in body:
        return f"healthy, but /completion answered {str(body)[:200]}"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _spawn(argv: list[str], log_path: Path, lib_dir: Path) -> subprocess.Popen[bytes]:
    # Like the wheel's own launcher: its bundled libraries (libvulkan among them) win.
    lib_path = os.pathsep.join(p for p in (str(lib_dir), os.environ.get("LD_LIBRARY_PATH")) if p)
    env = {**os.environ, "LD_LIBRARY_PATH": lib_path}
    with log_path.open("wb") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group, stopped as a whole
        )


def _wait_healthy(proc: subprocess.Popen[bytes], base_url: str, timeout_s: float) -> str | None:
    """None once ``/health`` answers 200; otherwise why not."""
    # Loopback only: never let an http_proxy setting route the probe elsewhere.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            return f"exited with {code} before it was healthy"
        try:
            with opener.open(base_url + "/health", timeout=2.0) as response:
                if response.status == 200:
                    return None
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet, or 503 while the model loads
        time.sleep(0.05)
    return f"/health not 200 within {timeout_s:.0f} s"


def _stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout_s: float) -> None:
    """SIGTERM the process group, SIGKILL it if it outlives ``timeout_s``."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        return


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def main(argv: Sequence[str] | None = None) -> int:
    """``probe BINARY MODEL``: exit 0 when it serves here, 1 when not, 3 with no verdict;
    ``probe-answer BINARY MODEL``: the same for answering the known question correctly."""
    parser = argparse.ArgumentParser(prog="server.py", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for command, help_text in (
        ("probe", "does BINARY serve MODEL on this CPU?"),
        ("probe-answer", f"does BINARY serving MODEL answer {KNOWN_QUESTION!r} correctly?"),
    ):
        probing = commands.add_parser(command, help=help_text)
        probing.add_argument("binary", type=Path)
        probing.add_argument("model", type=Path)
        probing.add_argument("--log-dir", type=Path, required=True)
        probing.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    args = parser.parse_args(argv)
    check = probe if args.command == "probe" else probe_answer
    try:
        problem = check(args.binary, args.model, log_dir=args.log_dir, timeout_s=args.timeout)
    except ServerDidNotStart as exc:
        print(exc, file=sys.stderr)
        return 3
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
