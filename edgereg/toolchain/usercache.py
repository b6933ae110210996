"""Where downloaded tools live: one cache per user, shared by every repository.

The old MNN runtimes that prove ``min_mnn_runtime`` (a few tens of MB each) and
the aarch64 sysroot of ARM verification (about 300 MB) depend on the MNN
version, not on the project: every repository of a user on one machine uses
the same copy, installed once (``edgereg toolchain runtimes install``,
``edgereg toolchain arm install``)::

    $EDGEREG_CACHE_DIR, else $XDG_CACHE_HOME/edgereg, else ~/.cache/edgereg
    (~/Library/Caches/edgereg on macOS)
      runtimes/mnn-3.0.0/      $EDGEREG_RUNTIMES_DIR moves this one alone
      arm/mnn-3.6.1/           $EDGEREG_ARM_DIR moves this one alone

Installs build in a temporary directory beside their destination and rename
it into place, so two repositories installing at once leave one good copy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: Moves the whole cache (runtimes and sysroots).
CACHE_DIR_ENV = "EDGEREG_CACHE_DIR"


def user_cache_dir() -> Path:
    """The per-user cache directory (absolute; it may not exist yet)."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "edgereg"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "edgereg"
    return Path.home() / ".cache" / "edgereg"
