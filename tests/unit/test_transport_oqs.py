"""The liboqs shortcut gives find_library's own answer, only faster."""

import ctypes.util

from mctl.transport import oqs


def test_absent_from_cache(tmp_path, monkeypatch):
    cache = tmp_path / "ld.so.cache"
    cache.write_bytes(b"\x00libc.so.6\x00libm.so.6\x00")
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    assert oqs.liboqs_present(str(cache)) is False


def test_present_in_cache_or_path(tmp_path, monkeypatch):
    cache = tmp_path / "ld.so.cache"
    cache.write_bytes(b"\x00liboqs.so.5\x00")
    assert oqs.liboqs_present(str(cache)) is True
    cache.write_bytes(b"")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "liboqs.so.5").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "lib"))
    assert oqs.liboqs_present(str(cache)) is True


def test_no_cache_means_real_search(tmp_path):
    assert oqs.liboqs_present(str(tmp_path / "missing")) is True


def test_installed_shortcut_agrees_with_the_real_search(processes):
    import mctl.transport  # noqa: F401  (installs the shortcut)

    if oqs.liboqs_present():
        return
    assert ctypes.util.find_library("oqs") is None
    assert ctypes.util.find_library("liboqs") is None
    assert ctypes.util.find_library("c") is not None   # other names still searched
