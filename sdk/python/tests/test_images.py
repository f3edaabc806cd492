"""Images from the SDK: import an archive, pull from a registry, and the conflict a tag that
exists raises unless ``force``; sandboxes of the new image see its files."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

import warren


def _tar(entries: dict) -> bytes:
    """An uncompressed tar of ``{path: text}`` (``text`` None: a directory)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, text in entries.items():
            info = tarfile.TarInfo(name)
            if text is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                t.addfile(info)
            else:
                data = text.encode()
                info.size, info.mode = len(data), 0o644
                t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def docker_archive(path: Path, entries: dict) -> None:
    """A ``docker save`` archive of one layer."""
    layer = _tar(entries)
    diff = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {}, "rootfs": {"type": "layers", "diff_ids": [diff]}}).encode()
    cname = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": cname, "RepoTags": ["x:1"], "Layers": ["l1/layer.tar"]}]).encode()
    with tarfile.open(path, "w") as t:
        for name, data in (("l1/layer.tar", layer), (cname, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def test_import_an_archive_then_replace_it_only_with_force(client: warren.Client, tmp_path: Path) -> None:
    tag = f"sdk-import-{os.getpid()}:1"
    old, new = tmp_path / "old.tar", tmp_path / "new.tar"
    docker_archive(old, {"srv/": None, "srv/which": "old"})
    docker_archive(new, {"srv/": None, "srv/which": "new"})
    r = client.import_image(str(old), tag)
    assert r["image"]["reference"] == tag and r["converted"] == 1
    assert r["image"]["source"] == "upload", "no path of the node's scratch space"
    try:
        with pytest.raises(warren.Conflict) as e:
            client.import_image(str(new), tag)
        assert "--force" in str(e.value)
        with client.create(image=["default", tag]) as sb:
            assert sb.exec(["cat", "/srv/which"]).stdout == "old"
        client.import_image(str(new), tag, force=True)
        with client.create(image=["default", tag]) as sb:
            assert sb.exec(["cat", "/srv/which"]).stdout == "new"
        # A pull names the same conflict before it reaches any registry.
        with pytest.raises(warren.Conflict):
            client.pull_image("127.0.0.1:9/never/reached:1", tag, insecure=True)
    finally:
        client.delete_image(tag)


async def test_pull_of_an_unreachable_registry_says_so(aclient: warren.AsyncClient) -> None:
    with pytest.raises(warren.RegistryUnreachable) as e:
        await aclient.pull_image("127.0.0.1:9/never/reached:1", f"sdk-pull-{os.getpid()}:1", insecure=True)
    assert "cannot reach the registry 127.0.0.1:9" in str(e.value)
    assert e.value.status == 502
