"""The duplicate-library check's pure part: sonames read from real ELF files, and every layer
of a `docker save` archive (both layouts) read as a stream, shadowed and deleted files included."""

import io
import json
import tarfile
from pathlib import Path

import pytest

from buildsys import smoke


def loaded_libraries() -> dict[str, Path]:
    """soname -> path of the real shared libraries this interpreter has loaded."""
    found = {}
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = Path(line.split()[-1]) if "/" in line else None
        if path and path.is_file() and smoke.SHARED_OBJECT_RE.search(path.name):
            soname = smoke.elf_soname(path.read_bytes())
            if soname:
                found.setdefault(soname, path)
    return found


LIBS = loaded_libraries()


@pytest.fixture(scope="module")
def two_libs() -> list[tuple[str, bytes]]:
    assert len(LIBS) >= 2, f"expected the interpreter to have loaded shared libraries, got {LIBS}"
    return [(soname, path.read_bytes()) for soname, path in sorted(LIBS.items())[:2]]


def test_soname_of_real_libraries_and_none_for_everything_else():
    assert "libc.so.6" in LIBS
    assert smoke.elf_soname(LIBS["libc.so.6"].read_bytes()) == "libc.so.6"
    import _json                                  # a Python extension module: ELF, loaded by path, no soname
    assert smoke.elf_soname(Path(_json.__file__).read_bytes()) is None
    assert smoke.elf_soname(b"not an ELF file") is None
    assert smoke.elf_soname(b"\x7fELF" + b"\0" * 12) is None         # truncated header


def test_shared_object_names():
    for name in ("libcupti.so", "libcupti.so.12", "libcupti.so.2025.1.0", "_C.cpython-313-x86_64-linux-gnu.so"):
        assert smoke.SHARED_OBJECT_RE.search(name), name
    for name in ("libfoo.a", "foo.so.txt", "libso.py", "notes.sources"):
        assert not smoke.SHARED_OBJECT_RE.search(name), name


def tar_bytes(entries: list[tuple[str, bytes | None, str | None]]) -> bytes:
    """A tar of (path, content, symlink target): a file when content is given, else a link."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, content, link in entries:
            info = tarfile.TarInfo(path)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def docker_save(layers: list[bytes], oci: bool) -> io.BytesIO:
    """A `docker save` archive: legacy (<id>/layer.tar) or OCI (blobs/sha256/<digest>) layout,
    with the JSON files both layouts also carry."""
    entries = []
    for i, layer in enumerate(layers):
        entries.append((f"blobs/sha256/{i:064x}" if oci else f"{i:064x}/layer.tar", layer, None))
    entries.append(("blobs/sha256/" + "f" * 64 if oci else "config.json", json.dumps({"os": "linux"}).encode(), None))
    entries.append(("manifest.json", b"[]", None))
    return io.BytesIO(tar_bytes(entries))


@pytest.mark.parametrize("oci", [False, True], ids=["legacy", "oci"])
def test_every_layer_is_read_and_a_shadowed_copy_is_a_duplicate(two_libs, oci):
    (first, first_bytes), (second, second_bytes) = two_libs
    import _json
    base = tar_bytes([(f"usr/lib/{first}", first_bytes, None), (f"usr/lib/{second}", second_bytes, None),
                      ("usr/lib/libalias.so", None, first),
                      ("opt/venv/_json.cpython.so", Path(_json.__file__).read_bytes(), None),
                      ("etc/os-release", b"ID=debian\n", None)])
    # A later layer puts the same library elsewhere and deletes the first copy: both cost space.
    later = tar_bytes([(f"opt/venv/lib/vendored/{first}", first_bytes, None),
                       (f"usr/lib/.wh.{first}", b"", None)])
    objects = list(smoke.layer_shared_objects(docker_save([base, later], oci)))
    assert sorted((o.path, o.soname) for o in objects) == sorted(
        [(f"usr/lib/{first}", first), (f"usr/lib/{second}", second), (f"opt/venv/lib/vendored/{first}", first)])
    assert len({o.layer for o in objects}) == 2
    duplicates = smoke.duplicate_sonames(objects)
    assert list(duplicates) == [first]
    ok, detail = smoke.check_duplicates(objects)
    assert not ok
    assert detail.startswith("1 sonames stored more than once")
    assert f"{first}: 2 files" in detail and f"opt/venv/lib/vendored/{first}" in detail


def test_one_copy_each_passes(two_libs):
    layer = tar_bytes([(f"usr/lib/{name}", content, None) for name, content in two_libs])
    objects = list(smoke.layer_shared_objects(docker_save([layer], oci=False)))
    ok, detail = smoke.check_duplicates(objects)
    assert ok and detail.startswith("2 shared libraries")


def test_duplicates_are_ordered_by_wasted_bytes_and_the_list_is_capped():
    big = [smoke.SharedObject(f"l{i}", f"p{i}/libbig.so.1", "libbig.so.1", 1000) for i in range(3)]
    small = [smoke.SharedObject(f"l{i}", f"p{i}/libsmall.so.1", "libsmall.so.1", 10) for i in range(2)]
    single = [smoke.SharedObject("l0", "libone.so.1", "libone.so.1", 5)]
    duplicates = smoke.duplicate_sonames(small + single + big)
    assert list(duplicates) == ["libbig.so.1", "libsmall.so.1"]
    ok, detail = smoke.check_duplicates(small + single + big, shown=1)
    assert not ok
    assert "(0 MB extra)" in detail.splitlines()[0] and "libbig.so.1: 3 files, 0.0 MB extra" in detail
    assert "libsmall.so.1:" not in detail and "... and 1 more" in detail


def test_triton_s_blackwell_cupti_is_a_second_copy_kept_on_purpose():
    """Triton 3.8 ships a newer CUPTI for Blackwell next to its own: kept, named, not counted;
    the same library anywhere else still counts."""
    wheel = smoke.SharedObject("l0", "opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib/libcupti.so.13",
                               "libcupti.so.13", 4_000_000)
    blackwell = smoke.SharedObject("l0", "opt/venv/lib/python3.11/site-packages/triton/backends/nvidia/lib/"
                                   "cupti-blackwell/libcupti.so", "libcupti.so.13", 6_000_000)
    ok, detail = smoke.check_duplicates([wheel, blackwell])
    assert ok and "1 shared libraries" in detail and "kept on purpose: 1 in triton/backends/nvidia/lib/cupti-blackwell/" in detail
    elsewhere = smoke.SharedObject("l1", "opt/venv/lib/vendored/libcupti.so.13", "libcupti.so.13", 4_000_000)
    ok, detail = smoke.check_duplicates([wheel, blackwell, elsewhere])
    assert not ok and "libcupti.so.13: 2 files" in detail and "cupti-blackwell" not in detail
