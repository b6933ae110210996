"""The registry's own error, apart from the release preparation that raises it most.

The read path (status, history, verify, serve) imports it without the build
outputs and models.toml's schema that preparing a release needs.
"""

from __future__ import annotations

from edgereg.errors import EdgeregError, ExitCode


class ReleaseError(EdgeregError):
    """The build outputs cannot be published as they are."""

    exit_code = ExitCode.NOT_PUBLISHABLE
