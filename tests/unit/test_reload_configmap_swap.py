"""Files mounted the way a Kubernetes ConfigMap volume mounts them: each name a link
through `..data` to a timestamped directory, and an update written as a new directory,
`..data` renamed to point at it, the old directory removed. The running gateway notices
each swap: a key revoked in the keys file and a policy narrowed in a policy directory
mounted so are enforced, though no file it names was written in place (the files' own
mtimes and sizes may equal the old ones: the link's target is another inode)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import yaml

from gateway.app import create_app
from gateway.config import load_config
from gateway.tenants import hash_api_key
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.reload_files import versioned_policy

KEY = "og-configmap-swap-key-0123456789ab"
OTHER = "og-configmap-swap-key-ba9876543210"  # the same length: the same file size


def _mount(volume: Path, files: dict[str, str], generation: int) -> None:
    """Publish `files` in `volume` as kubelet does (atomic_writer.go): a new hidden
    directory, `..data_tmp` linked to it and renamed over `..data`, the old one removed;
    each name a link to `..data/<name>`. Every file keeps one fixed mtime."""
    volume.mkdir(exist_ok=True)
    fresh = volume / f"..2026_12_06_{generation:02d}"
    fresh.mkdir()
    for name, text in files.items():
        (fresh / name).write_text(text)
        os.utime(fresh / name, ns=(1_000_000_000, 1_000_000_000))
    old = os.readlink(volume / "..data") if (volume / "..data").is_symlink() else None
    (volume / "..data_tmp").symlink_to(fresh.name)
    os.replace(volume / "..data_tmp", volume / "..data")
    for name in files:
        if not (volume / name).is_symlink():
            (volume / name).symlink_to(f"..data/{name}")
    if old is not None:
        for leftover in (volume / old).iterdir():
            leftover.unlink()
        (volume / old).rmdir()


def _keys(key: str) -> str:
    return yaml.safe_dump({"tenants": {"acme": [hash_api_key(key)]}})


def test_a_configmap_swap_of_the_keys_file_and_the_policies_is_enforced(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config"
    policies = config / "policies"
    data = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["policies"]}
    ).model_dump(mode="json", exclude_none=True)
    data["tenants"][0]["api_key_hashes"] = []
    data["keys_file"] = "keys.yaml"
    text = yaml.safe_dump(data)
    _mount(config, {"gateway.yaml": text, "keys.yaml": _keys(KEY)}, 1)
    _mount(policies, {"p.yaml": versioned_policy("1", "eu")}, 1)
    path = config / "gateway.yaml"
    app = create_app(load_config(path), environ={}, config_dir=config, config_file=path)
    reloader = app.reloader
    assert reloader is not None
    assert app.parts.config.tenants[0].api_key_hashes == (hash_api_key(KEY),)

    # The key rotated: the same size, the same mtime, only the link's target differs.
    _mount(config, {"gateway.yaml": text, "keys.yaml": _keys(OTHER)}, 2)
    _mount(policies, {"p.yaml": versioned_policy("2", "us")}, 2)  # the same size too

    async def looks() -> None:
        for _ in range(4):  # bounded: a change settles in two looks
            await reloader.poll()
            app.policies.poll()

    asyncio.run(looks())
    assert app.parts.config.tenants[0].api_key_hashes == (hash_api_key(OTHER),)
    assert app.policies.latest().compiled("p").version == "2"
    assert reloader.last_error is None and app.policies.last_error is None
