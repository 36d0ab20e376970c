"""`rlm_graph.cli.read_roots`: what ``rlm-graph mcp`` reads, in-process (no server)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlm_graph.cli.read_roots import ReadRoots
from rlm_graph.errors import ConfigError


def roots(*paths: Path, max_bytes: int = 1 << 20, max_files: int = 100) -> ReadRoots:
    return ReadRoots([str(p) for p in paths], max_bytes=max_bytes, max_files=max_files)


def test_a_fifo_a_device_and_the_proc_files_are_never_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")  # opening it for reading would block forever
    with pytest.raises(ConfigError, match="not a regular file"):
        roots(tmp_path).read(["pipe"])
    everything = roots(Path("/"))
    for path in ("/proc/self/environ", "/proc/1/mem", "/dev/zero", "/sys/kernel/notes"):
        with pytest.raises(ConfigError, match="never read"):
            everything.read([path])
    (tmp_path / "env").symlink_to("/proc/self/environ")
    with pytest.raises(ConfigError, match="never read"):
        roots(tmp_path).read(["env"])
    # Met in a walk, the FIFO is skipped, not waited on.
    (tmp_path / "note.txt").write_text("a note")
    docs = roots(tmp_path).read(["."])
    assert list(docs.files.values()) == ["a note"]
    assert any("pipe" in s and "not a regular file" in s for s in docs.skipped)


def test_the_byte_and_file_limits_fail_the_call_and_name_their_flag(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"{i}.txt").write_text("x" * 100)
    assert roots(tmp_path).read(["."]).size == 300
    with pytest.raises(ConfigError, match="--max-read-bytes"):
        roots(tmp_path, max_bytes=250).read(["."])
    with pytest.raises(ConfigError, match="--max-read-files"):
        roots(tmp_path, max_files=2).read(["."])


def test_a_prefix_of_a_root_is_not_inside_it_and_roots_must_exist(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data-2").mkdir()
    (tmp_path / "data-2" / "x.txt").write_text("no")
    with pytest.raises(ConfigError, match="outside the folders"):
        roots(tmp_path / "data").read([str(tmp_path / "data-2" / "x.txt")])
    with pytest.raises(ConfigError, match="does not exist"):
        roots(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="at least one --read-path"):
        ReadRoots([], max_bytes=1, max_files=1)


def test_a_file_read_twice_is_one_document_and_text_is_decoded_with_replacement(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.txt").write_bytes(b"caf\xe9 ok")  # latin-1, not UTF-8
    (tmp_path / "same.txt").symlink_to(tmp_path / "a.txt")
    docs = roots(tmp_path).read(["a.txt", ".", "same.txt"])
    assert docs.files == {str(tmp_path / "a.txt"): "caf\ufffd ok"}


def test_a_folder_the_server_cannot_open_is_listed_not_silently_dropped(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root opens any folder, whatever its mode")
    (tmp_path / "closed").mkdir()
    (tmp_path / "closed" / "x.txt").write_text("hidden")
    (tmp_path / "open.txt").write_text("seen")
    (tmp_path / "closed").chmod(0)
    try:
        docs = roots(tmp_path).read(["."])
    finally:
        (tmp_path / "closed").chmod(0o700)
    assert list(docs.files.values()) == ["seen"]
    assert any("closed" in s for s in docs.skipped)


def test_a_linked_folder_in_a_walk_is_listed_not_silently_dropped(tmp_path: Path) -> None:
    root, outside = tmp_path / "proj", tmp_path / "outside"
    for folder in (root / "inner", outside):
        folder.mkdir(parents=True)
        (folder / "note.txt").write_text(f"{folder.name} note")
    (root / "out").symlink_to(outside)
    (root / "again").symlink_to(root / "inner")
    docs = roots(root).read(["."])
    assert list(docs.files.values()) == ["inner note"]  # neither link walked into
    assert sorted(s.split("/")[-1] for s in docs.skipped) == [
        "again: a linked folder, not followed",
        "out: a link out of the read roots",
    ]


def test_a_binary_file_is_skipped_from_its_first_bytes_whatever_its_size(tmp_path: Path) -> None:
    (tmp_path / "README").write_text("twelve bytes")
    (tmp_path / "blob.bin").write_bytes(b"\0" * 5000)  # larger than the whole limit
    docs = roots(tmp_path, max_bytes=2000).read(["."])
    assert list(docs.files.values()) == ["twelve bytes"] and docs.size == 12
    assert any(s.endswith("blob.bin: binary") for s in docs.skipped)


def test_a_file_name_that_is_not_utf8_is_read_and_shown_escaped(tmp_path: Path) -> None:
    folder = os.fsencode(tmp_path)
    with open(os.path.join(folder, b"bad\xff.txt"), "wb") as handle:
        handle.write(b"text")
    with open(os.path.join(folder, b"img\xe9.bin"), "wb") as handle:
        handle.write(b"\0binary")
    docs = roots(tmp_path).read(["."])
    (name,) = docs.files
    assert name.endswith("bad\\xff.txt") and docs.files[name] == "text"
    name.encode("utf-8")  # no lone surrogate: it goes into JSON and prints in the guest
    (skipped,) = docs.skipped
    assert skipped.endswith("img\\xe9.bin: binary")


def test_a_folder_nested_past_what_a_walk_can_recurse_is_refused_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rlm_graph.cli.read_roots as read_roots

    def too_deep(*args: object, **kwargs: object) -> object:
        raise RecursionError("maximum recursion depth exceeded")  # as os.walk, 1,000 deep

    (tmp_path / "note.txt").write_text("deep")
    monkeypatch.setattr(read_roots.os, "walk", too_deep)
    with pytest.raises(ConfigError, match="'.' nests folders too deep to walk; name a folder"):
        roots(tmp_path).read(["."])


def test_the_mcp_answer_says_how_many_skipped_files_it_left_out() -> None:
    from rlm_graph.cli.mcp import _listed

    skipped = [f"f{i}.bin: binary" for i in range(250)]
    shown = _listed(skipped, 200)
    assert len(shown) == 201 and shown[-1] == "... and 50 more files skipped"
    assert _listed(skipped[:3], 200) == skipped[:3]


def test_a_read_whose_stop_is_set_ends_at_its_next_entry(tmp_path: Path) -> None:
    import threading

    from rlm_graph.cli.read_roots import ReadStopped

    for i in range(3):
        (tmp_path / f"{i}.txt").write_text("x")
    stop = threading.Event()
    assert len(roots(tmp_path).read(["."], stop=stop).files) == 3
    stop.set()
    for named in (["."], ["0.txt"]):
        with pytest.raises(ReadStopped):
            roots(tmp_path).read(named, stop=stop)


def test_a_walk_past_ten_entries_per_file_allowed_fails_and_names_the_flag(
    tmp_path: Path,
) -> None:
    """Binary and skipped files count toward no limit of what is read, and a folder of
    countless ones was walked to its end at any limits."""
    for i in range(21):
        (tmp_path / f"{i}.bin").write_bytes(b"\0")
    with pytest.raises(ConfigError, match="more than 20 files and folders.*--max-read-files"):
        roots(tmp_path, max_files=2).read(["."])
    assert len(roots(tmp_path, max_files=3).read(["."]).skipped) == 21


def test_only_the_text_files_read_count_toward_the_file_limit(tmp_path: Path) -> None:
    """A binary file, or a link out of the roots, met after the last file allowed failed
    the call as one file too many."""
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "b.txt").write_text("b")
    (tmp_path / "c.bin").write_bytes(b"\0")
    (tmp_path / "d.txt").symlink_to("/etc/hostname")
    docs = roots(tmp_path, max_files=2).read(["."])
    assert sorted(Path(p).name for p in docs.files) == ["a.txt", "b.txt"]
    assert len(docs.skipped) == 2
    (tmp_path / "e.txt").write_text("e")
    with pytest.raises(ConfigError, match="more than 2 files.*--max-read-files"):
        roots(tmp_path, max_files=2).read(["."])
