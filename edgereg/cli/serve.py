"""The ``edgereg serve`` command (registered in :mod:`edgereg.cli`)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import click

from edgereg.cli._common import (
    Seconds,
    config_option_for,
    endpoint_option,
    handle_errors,
    open_registry,
    optional_config,
    print_note,
    print_result,
    registry_option,
    stderr,
    trusted_key_option,
)
from edgereg.serve._app import DEFAULT_REPORT_BURST, DEFAULT_REPORT_RATE
from edgereg.serve._server import DEFAULT_HEAD_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_TIMEOUT

log = logging.getLogger("edgereg.serve")
#: Seconds between two retention passes over the report store.
PRUNE_INTERVAL = 3600.0


@click.command("serve")
@registry_option
@config_option_for("The models.toml whose [registry] to serve when --registry is not given.")
@endpoint_option
@trusted_key_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="Port to listen on (0: any free port; the chosen one is printed).",
)
@click.option(
    "--manifest-max-age",
    type=click.IntRange(min=0),
    default=60,
    show_default=True,
    help="Seconds clients and CDNs may reuse a manifest without asking again.",
)
@click.option(
    "--timeout",
    type=Seconds(minimum=0.1),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds a connection may stay idle or stall.",
)
@click.option(
    "--head-timeout",
    type=Seconds(minimum=0.1),
    default=DEFAULT_HEAD_TIMEOUT,
    show_default=True,
    help="Seconds a client has to send a whole request head once it began (slow clients "
    "are cut off).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_CONNECTIONS,
    show_default=True,
    help="Connections served at once; more are answered 503 at once.",
)
@click.option(
    "--shutdown-timeout",
    type=Seconds(allow_zero=True),
    default=30.0,
    show_default=True,
    help="On SIGTERM/SIGINT, seconds to let answers in flight finish.",
)
@click.option(
    "--reports",
    "reports_url",
    default=None,
    metavar="STORE_URL",
    help="Accept device reports on POST /v1/reports into this store (sqlite:///PATH or "
    "postgresql://...). Default: models.toml [reports] store when serving a project; "
    "without a project and this option, /v1/reports answers 404.",
)
@click.option(
    "--reports-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_REPORT_RATE,
    show_default=True,
    help="Reports per second accepted from one client address (IPv6: one /64); more get 429.",
)
@click.option(
    "--reports-burst",
    type=click.IntRange(min=1),
    default=DEFAULT_REPORT_BURST,
    show_default=True,
    help="Reports one address may send at once before --reports-rate applies.",
)
@click.option("--access-log", is_flag=True, help="Log every request to stderr.")
def serve_command(**options: Any) -> None:
    """Serve the registry over read-only HTTP, and take device reports on POST /v1/reports.

    Manifests, blobs, status page, metrics: read-only. Reports go to the
    report store only, never the registry; a store outage answers reports
    503 and leaves delivery alone.

    Stops gracefully on SIGTERM or Ctrl-C: no new connections, answers in
    flight finish, exit status 0.
    """
    handle_errors(_serve)(**options)


def _serve(
    registry_url: str | None,
    config_path: Path,
    endpoint_url: str | None,
    trusted_key_paths: tuple[Path, ...],
    host: str,
    port: int,
    manifest_max_age: int,
    timeout: float,
    head_timeout: float,
    max_connections: int,
    shutdown_timeout: float,
    reports_url: str | None,
    reports_rate: float,
    reports_burst: int,
    access_log: bool,
) -> None:
    from edgereg.errors import EdgeregError
    from edgereg.serve._server import make_server

    config = optional_config(config_path)
    registry = open_registry(config, registry_url, endpoint_url, trusted_key_paths)
    pinned = config is not None or bool(trusted_key_paths)
    if pinned:
        registry.trusted_keys()  # a bad pinned key file stops the start, not the first page
    else:
        stderr.print(
            "warning: no models.toml here and no --trusted-key: the status page shows the "
            "registry unverified (manifests and blobs are served as they are; apps verify them)",
            markup=False,
        )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("edgereg.serve")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if access_log else logging.WARNING)
    from edgereg.config import Reports
    from edgereg.reports import ReportStoreError, StoreURLError, open_store
    from edgereg.reports.batch import GroupCommit
    from edgereg.serve._ratelimit import RateLimiter

    report_settings = config.reports if config is not None else Reports()
    store_url = reports_url or (report_settings.store if config is not None else None)
    store = None
    if store_url is not None:
        try:
            store = open_store(store_url, base_dir=config.root if config is not None else None)
        except StoreURLError as exc:
            where = "--reports" if reports_url else f"{config_path}: [reports] store"
            exc.message = f"{where}: {exc.message}"
            raise
        # The store a project gets without asking ([reports] store unset) must
        # not stop a server that used to start, e.g. in a read-only checkout.
        chosen = reports_url is not None or "store" in report_settings.model_fields_set
        try:
            store.check()
        except ReportStoreError as exc:
            if not exc.retryable and chosen:
                raise
            if not exc.retryable:
                stderr.print(
                    f"warning: {exc.message}; this server keeps no reports (set [reports] "
                    "store or --reports to choose a store)",
                    markup=False,
                )
                store.close()
                store = None
            else:
                # Delivery must not wait for the report store: serve, and answer
                # reports 503 until the store answers.
                stderr.print(
                    f"warning: {exc.message}; POST /v1/reports answers 503 until it answers",
                    markup=False,
                )
    sink = GroupCommit(store) if store is not None else None
    try:
        server = make_server(
            registry.storage,
            host,
            port,
            manifest_max_age=manifest_max_age,
            timeout=timeout,
            head_timeout=head_timeout,
            max_connections=max_connections,
            trusted=registry.trusted_keys if pinned else None,
            policy=config.rollout_policy if config is not None else None,
            reports=sink,
            report_limiter=RateLimiter(reports_rate, reports_burst),
        )
    except OSError as exc:
        raise EdgeregError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="Pick another --port, or stop what is using it.",
        ) from exc

    stop = threading.Event()
    received: list[str] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()
        # A second signal stops at once (the default action).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    # The address is the result (with --port 0, the only place it is told): stdout.
    print_result(f"serving {registry.storage.url} on {server.base_url} (Ctrl-C or SIGTERM to stop)")
    if store is not None:
        print_note(f"reports: POST {server.base_url}/v1/reports into {store.url}")
        _start_pruning(store, report_settings.retention_days, stop)
    while not stop.wait(0.5):
        pass
    stderr.print(f"{received[0]}: finishing answers in flight, then stopping", markup=False)
    if not server.drain(shutdown_timeout):
        stderr.print(
            f"stopped with connections still open after {shutdown_timeout:g}s", markup=False
        )
    if sink is not None:
        sink.close()  # stores what is queued, then closes the store


def _start_pruning(store: Any, retention_days: int, stop: threading.Event) -> None:
    """Delete reports past the retention now and every hour, while serving."""
    from datetime import datetime, timedelta, timezone

    from edgereg.errors import StorageError

    def prune() -> None:
        while True:
            try:
                store.prune(datetime.now(timezone.utc) - timedelta(days=retention_days))
            except StorageError as exc:  # the next pass tries again
                log.warning("pruning the report store failed: %s", exc.message)
            if stop.wait(PRUNE_INTERVAL):
                return

    threading.Thread(target=prune, name="edgereg-report-retention", daemon=True).start()
