"""Settings scoped to a thread and a ``with`` block: what ``rome.launch.product``,
``rome.launch.target_warp_size``, ``rome.launcher.capture`` and ``rome.ops.positions_checked``
share. Imports nothing of rome's."""

from __future__ import annotations

import contextlib
import threading
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class ThreadSetting(Generic[T]):
    """A value per thread, ``default`` where no block has set it; ``scoped(v)`` sets it to ``v``
    for a ``with`` block (nested blocks restore the value around them, exceptions too)."""

    def __init__(self, default: T):
        self._local = threading.local()
        self._default = default

    def get(self) -> T:
        return getattr(self._local, "value", self._default)

    @contextlib.contextmanager
    def scoped(self, value: T) -> Iterator[T]:
        old = self.get()
        self._local.value = value
        try:
            yield value
        finally:
            self._local.value = old
