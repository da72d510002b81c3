"""What the local servers share: ``close`` and the context-manager protocol."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class LocalServer:
    """Base of the local servers: ``with Server() as s`` starts it and cleans up after.

    Subclasses set ``_owns_dir`` (True when ``base_dir`` is a temporary directory they made)
    and implement ``start``, ``stop`` and ``destroy``.
    """

    _owns_dir: bool

    def start(self, timeout: float = 120.0) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 60.0) -> None:
        raise NotImplementedError

    def destroy(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop; also delete everything when ``base_dir`` was a temporary directory."""
        if self._owns_dir:
            self.destroy()
        else:
            self.stop()

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
