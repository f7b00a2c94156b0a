"""``rome.settings.ThreadSetting``, behind ``launch.product``, ``launch.target_warp_size``, ``launch.target_arch``,
``launcher.capture`` and ``ops.positions_checked``: a value per thread, restored on leaving a
block (nested, raising), invisible to other threads."""

from __future__ import annotations

import threading

import pytest

from rome import launch, launcher, ops
from rome.settings import ThreadSetting


def test_nested_blocks_restore_and_an_exception_too():
    s = ThreadSetting("a")
    assert s.get() == "a"
    with s.scoped("b") as v:
        assert v == "b" and s.get() == "b"
        with s.scoped("c"):
            assert s.get() == "c"
        assert s.get() == "b"
        with pytest.raises(RuntimeError), s.scoped("d"):
            raise RuntimeError
        assert s.get() == "b"
    assert s.get() == "a"


def test_another_thread_sees_the_default():
    s = ThreadSetting(0)
    seen = []
    with s.scoped(1):
        t = threading.Thread(target=lambda: seen.append(s.get()))
        t.start()
        t.join()
        assert s.get() == 1
    assert seen == [0]


def test_the_settings_scope_and_restore():
    assert launch.current_product() == "gather"
    with launch.product("dot"):
        assert launch.current_product() == "dot"
    assert launch.current_product() == "gather"
    with pytest.raises(ValueError, match="product must be one of"), launch.product("matmul"):
        pass

    default = launch.warp_size()
    with launch.target_warp_size(64):
        assert launch.warp_size() == 64
    assert launch.warp_size() == default
    with pytest.raises(ValueError, match="lanes must be 32 or 64, got 16"), launch.target_warp_size(16):
        pass

    arch = launch.current_arch()
    with launch.target_arch("gfx942"):
        assert launch.current_arch() == "gfx942" and launch.warp_size() == 64
        with launch.target_arch(80):
            assert launch.current_arch() == 80 and launch.warp_size() == 32
        assert launch.current_arch() == "gfx942"
    assert launch.current_arch() == arch and launch.warp_size() == default
    for bad in ("sm_90", 9.0, True, None):
        with pytest.raises(ValueError, match="arch must be a compute capability"), launch.target_arch(bad):
            pass

    assert not launcher.capturing()
    with launcher.capture(num_sms=7) as launches:
        assert launcher.capturing() and launches == [] and launcher._num_sms(None) == 7
    assert not launcher.capturing()

    assert not ops._CHECKED.get()
    with ops.positions_checked():
        assert ops._CHECKED.get()
    assert not ops._CHECKED.get()
