"""E2B's SDK reads and writes a Warren sandbox's files: envd's `/files` upload and download
and its filesystem service (warren-envd) over the node's file routes."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("e2b")

from e2b import FileType  # noqa: E402
from e2b.exceptions import FileNotFoundException, NotFoundException  # noqa: E402


def test_write_and_read_text_and_bytes(e2b_sandbox):
    f = e2b_sandbox.files
    info = f.write("/tmp/e2b/deep/hello.txt", "hello, wörld\n")  # parents are made
    assert info.path == "/tmp/e2b/deep/hello.txt"
    assert info.name == "hello.txt"
    assert f.read("/tmp/e2b/deep/hello.txt") == "hello, wörld\n"
    blob = bytes(range(256)) * 64
    f.write("/tmp/e2b/blob.bin", blob)
    assert bytes(f.read("/tmp/e2b/blob.bin", format="bytes")) == blob
    # A file-like object goes up as a stream (octet-stream).
    f.write("/tmp/e2b/stream.bin", io.BytesIO(b"streamed"))
    assert f.read("/tmp/e2b/stream.bin") == "streamed"
    # Several at once (multipart).
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    written = f.write_files([WriteEntry(path="/tmp/e2b/a", data="A"), WriteEntry(path="/tmp/e2b/b", data=b"B")])
    assert sorted(w.path for w in written) == ["/tmp/e2b/a", "/tmp/e2b/b"]
    assert f.read("/tmp/e2b/a") + f.read("/tmp/e2b/b") == "AB"
    # What a command sees.
    assert e2b_sandbox.commands.run("cat /tmp/e2b/a /tmp/e2b/b").stdout == "AB"


def test_reading_a_missing_file_raises_not_found(e2b_sandbox):
    with pytest.raises(FileNotFoundException):
        e2b_sandbox.files.read("/tmp/no/such/file")


def test_list_exists_make_dir_rename_remove_get_info(e2b_sandbox):
    f = e2b_sandbox.files
    assert f.make_dir("/tmp/tree/sub") is True
    assert f.make_dir("/tmp/tree/sub") is False  # already there
    f.write("/tmp/tree/one.txt", "1")
    f.write("/tmp/tree/sub/two.txt", "22")

    top = {e.name: e for e in f.list("/tmp/tree")}
    assert set(top) == {"one.txt", "sub"}
    assert top["sub"].type == FileType.DIR
    assert top["one.txt"].type == FileType.FILE and top["one.txt"].size == 1
    deep = {e.path for e in f.list("/tmp/tree", depth=2)}
    assert deep == {"/tmp/tree/one.txt", "/tmp/tree/sub", "/tmp/tree/sub/two.txt"}

    assert f.exists("/tmp/tree/one.txt") is True
    assert f.exists("/tmp/tree/nope") is False

    info = f.get_info("/tmp/tree/sub/two.txt")
    assert (info.name, info.type, info.size, info.path) == ("two.txt", FileType.FILE, 2, "/tmp/tree/sub/two.txt")
    assert info.permissions.startswith("-rw")
    assert info.modified_time is not None

    moved = f.rename("/tmp/tree/one.txt", "/tmp/tree/uno.txt")
    assert moved.path == "/tmp/tree/uno.txt"
    assert f.exists("/tmp/tree/one.txt") is False
    assert f.read("/tmp/tree/uno.txt") == "1"

    f.remove("/tmp/tree")
    assert f.exists("/tmp/tree") is False
    with pytest.raises((FileNotFoundException, NotFoundException)):
        f.get_info("/tmp/tree")


def test_watch_dir_sees_creates_writes_and_removes(e2b_sandbox):
    from e2b import FilesystemEventType

    f = e2b_sandbox.files
    f.make_dir("/tmp/watched")
    w = f.watch_dir("/tmp/watched")
    try:
        f.write("/tmp/watched/new.txt", "x")
        e2b_sandbox.commands.run("echo more >> /tmp/watched/new.txt && rm -f /tmp/watched/gone 2>/dev/null; true")
        events = w.get_new_events()
        kinds = {(e.name, e.type) for e in events}
        assert ("new.txt", FilesystemEventType.CREATE) in kinds
        f.remove("/tmp/watched/new.txt")
        kinds = {(e.name, e.type) for e in w.get_new_events()}
        assert ("new.txt", FilesystemEventType.REMOVE) in kinds
    finally:
        w.stop()
