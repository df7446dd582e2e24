"""nginx as a bare reverse proxy: the overhead benchmark's `nginx` target, the floor.

One worker process (`worker_processes 1`, its master beside it, both in the measured
process tree), in the foreground, with its pid file, error log and temp directories in
the benchmark's run directory: no root needed. One `server` per simulator (the
coalesced and the paced one), each proxying everything to a keep-alive upstream
(`keepalive`, HTTP/1.1, `Connection: ""`) with `proxy_buffering off`, so a stream's
events are relayed as they arrive, as owngate relays them. No access log (owngate's
plain target writes none either); request bodies up to 1 MiB are held in memory
(`client_body_buffer_size`), so the 100 KB prompts never touch a temp file.

`nginx_binary()` is None when nginx is not installed: the target is then skipped with
"nginx not installed", never a crash.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

__all__ = ["NGINX_MISSING", "nginx_argv", "nginx_binary", "write_nginx_config"]

NGINX_MISSING = "nginx not installed (skipped: put nginx on PATH, e.g. apt install nginx-light)"
_SEARCHED = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")


def nginx_binary() -> str | None:
    """nginx on PATH or in its usual places, or None."""
    found = shutil.which("nginx")
    if found:
        return found
    return next((p for p in _SEARCHED if Path(p).is_file()), None)


def write_nginx_config(directory: Path, host: str, routes: Mapping[int, int]) -> Path:
    """Write `nginx/nginx.conf` under `directory`: for each `listen port: upstream port`
    of `routes`, a server proxying to that upstream on `host`. Returns the file."""
    home = directory / "nginx"
    home.mkdir(parents=True, exist_ok=True)
    temps = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    for name in temps:
        (home / name).mkdir(exist_ok=True)
    lines = [
        "worker_processes 1;",
        "daemon off;",
        f"pid {home / 'nginx.pid'};",
        f"error_log {home / 'error.log'} warn;",
        "events { worker_connections 4096; }",
        "http {",
        "  access_log off;",
        "  keepalive_requests 1000000;",
        "  client_max_body_size 8m;",
        "  client_body_buffer_size 1m;",
        *(f"  {name}_temp_path {home / name};" for name in temps),
    ]
    for listen, upstream in routes.items():
        lines += [
            f"  upstream sim_{upstream} {{ server {host}:{upstream}; keepalive 512; }}",
            f"  server {{ listen {host}:{listen};",
            f"    location / {{ proxy_pass http://sim_{upstream};",
            '      proxy_http_version 1.1; proxy_set_header Connection "";',
            "      proxy_buffering off; proxy_read_timeout 120s; } }",
        ]
    lines.append("}")
    config = home / "nginx.conf"
    config.write_text("\n".join(lines) + "\n")
    return config


def nginx_argv(binary: str, config: Path) -> list[str]:
    """nginx in the foreground with `config`, its prefix and early error log beside it."""
    home = config.parent
    return [binary, "-p", str(home), "-e", str(home / "error.log"), "-c", str(config)]
