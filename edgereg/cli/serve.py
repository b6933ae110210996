"""The ``edgereg serve`` command (registered in :mod:`edgereg.cli`)."""

from __future__ import annotations

import ipaddress
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeAlias

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
from edgereg.serve._server import (
    DEFAULT_HEAD_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_PER_ADDRESS,
    DEFAULT_TIMEOUT,
)

log = logging.getLogger("edgereg.serve")


Network = ipaddress.IPv4Network | ipaddress.IPv6Network

if TYPE_CHECKING:
    # click 8.2 made ParamType generic; 8.1 (still supported) cannot subscript it.
    _NetworkParam: TypeAlias = click.ParamType[Network, Any]
else:
    _NetworkParam = click.ParamType


class ProxyNetwork(_NetworkParam):
    """An IPv4 or IPv6 network in CIDR form (a bare address is its own /32 or /128)."""

    name = "cidr"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Network:
        """The network, or a usage error naming the value."""
        if isinstance(value, ipaddress.IPv4Network | ipaddress.IPv6Network):
            return value
        try:
            return ipaddress.ip_network(str(value).strip(), strict=False)
        except ValueError:
            self.fail(
                f"{value!r} is not a network: give an address or CIDR such as 10.0.0.0/8 "
                "or 2001:db8::/32",
                param,
                ctx,
            )


#: Seconds between two retention passes over the report store.
PRUNE_INTERVAL = 3600.0
#: Seconds between the server's clock marks in the report store (the clock install
#: ages are counted on: docs/operations/canary-analysis.md, "One clock").
CLOCK_INTERVAL = 60.0


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
    help="Seconds a client has to send a whole request head once it began, and again its "
    "body (slow clients are cut off; a connection still sending either may be closed for a "
    "new one when the server is full).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_CONNECTIONS,
    show_default=True,
    help="Connections open at once; past it a new one closes the oldest idle one "
    "(503 when every one is busy answering).",
)
@click.option(
    "--max-per-address",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_PER_ADDRESS,
    show_default=True,
    help="Connections one client address may hold; past it its new one closes its own "
    "oldest idle one. Devices behind one carrier NAT share an address.",
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
@click.option(
    "--trusted-proxy",
    "trusted_proxies",
    multiple=True,
    type=ProxyNetwork(),
    metavar="CIDR",
    help="A reverse proxy network (such as 10.0.0.0/8 or 127.0.0.1) whose X-Forwarded-For "
    "names the reporting device; repeatable. The header is read from the right, skipping "
    "trusted hops; from any other peer it is ignored (anyone can write it).",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Worker processes sharing the port (SO_REUSEPORT); one Python process answers on "
    "one core. Each limit above is the whole server's: every worker keeps its share "
    "(--max-connections, --max-per-address, --reports-rate and --reports-burst divided by N, "
    "and 200 // N new report tokens per source network an hour), so N workers never allow "
    "more than one process would. /metrics is per worker.",
)
@click.option(
    "--worker-timeout",
    type=Seconds(minimum=1),
    default=10.0,
    show_default=True,
    help="With --workers: a worker whose accept loop has not run for this long (stopped, "
    "hung) is killed and started again; until then the kernel keeps handing it its share "
    "of new connections.",
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
    max_per_address: int,
    shutdown_timeout: float,
    reports_url: str | None,
    reports_rate: float,
    reports_burst: int,
    trusted_proxies: tuple[Network, ...],
    workers: int,
    worker_timeout: float,
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
    server_options: dict[str, Any] = {
        "manifest_max_age": manifest_max_age,
        "timeout": timeout,
        "head_timeout": head_timeout,
        "trusted": registry.trusted_keys if pinned else None,
        "policy": config.rollout_policy if config is not None else None,
        "declared_metrics": config.unit_metrics if config is not None else None,
        "trusted_proxies": tuple(trusted_proxies),
        **worker_share(
            workers,
            max_connections=max_connections,
            max_per_address=max_per_address,
            reports_rate=reports_rate,
            reports_burst=reports_burst,
        ),
    }
    if workers > 1:
        _serve_workers(
            workers,
            registry,
            host,
            port,
            server_options,
            store,
            config.root if config is not None else None,
            report_settings.retention_days,
            shutdown_timeout,
            worker_timeout,
        )
        return
    sink = GroupCommit(store) if store is not None else None
    try:
        server = make_server(registry.storage, host, port, reports=sink, **server_options)
    except OSError as exc:
        raise EdgeregError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="Pick another --port, or stop what is using it.",
        ) from exc

    stop = threading.Event()
    received = _stop_on_signals(stop)
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


def worker_share(
    workers: int,
    *,
    max_connections: int,
    max_per_address: int,
    reports_rate: float,
    reports_burst: int,
) -> dict[str, Any]:
    """Each worker's share of the server's limits, so N workers allow no more than one.

    Workers share no memory: a limit kept per worker would be N times the
    documented one (two workers gave a /24 398 new report tokens in an hour
    against 200). Each gets an Nth, rounded down (at least 1): the kernel
    spreads connections evenly, so a client near a limit meets it a little
    early on one worker, never late in all.
    """
    from edgereg.serve._ratelimit import DEFAULT_TOKENS_PER_SOURCE, RateLimiter, SourceCaps

    return {
        "max_connections": max(1, max_connections // workers),
        "max_per_address": max(1, max_per_address // workers),
        "report_limiter": RateLimiter(reports_rate / workers, max(1, reports_burst // workers)),
        "source_caps": SourceCaps(tokens=max(1, DEFAULT_TOKENS_PER_SOURCE // workers)),
    }


def _stop_on_signals(stop: threading.Event) -> list[str]:
    """SIGTERM and SIGINT set ``stop``; a second one stops at once. Returns their names."""
    received: list[str] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()
        # A second signal stops at once (the default action).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return received


def _serve_workers(
    workers: int,
    registry: Any,
    host: str,
    port: int,
    server_options: dict[str, Any],
    store: Any,
    base_dir: Path | None,
    retention_days: int,
    shutdown_timeout: float,
    worker_timeout: float,
) -> None:
    """``--workers N``: the parent reserves the port and supervises N forked servers."""
    from edgereg.errors import EdgeregError
    from edgereg.reports import open_store
    from edgereg.reports.batch import GroupCommit
    from edgereg.serve._server import make_server
    from edgereg.serve._workers import reserve_port, run_workers

    store_url = store.url if store is not None else None
    if store is not None:
        store.close()  # each worker opens its own after the fork
    try:
        reserved = reserve_port(host, port)
    except OSError as exc:
        raise EdgeregError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="Pick another --port, or stop what is using it.",
        ) from exc
    port = int(reserved.getsockname()[1])

    def worker(index: int, stop: threading.Event, beat: Callable[[], None]) -> None:
        reserved.close()
        worker_store = open_store(store_url, base_dir=base_dir) if store_url else None
        sink = GroupCommit(worker_store) if worker_store is not None else None
        server = make_server(
            registry.storage, host, port, reports=sink, reuse_port=True, **server_options
        )
        server.heartbeat = beat
        server.start()
        if worker_store is not None and index == 0:
            _start_pruning(worker_store, retention_days, stop)
        while not stop.wait(0.5):
            pass
        server.drain(shutdown_timeout)
        if sink is not None:
            sink.close()

    stop = threading.Event()
    received = _stop_on_signals(stop)
    shown = f"[{host}]" if ":" in host else host
    base_url = f"http://{shown}:{port}"
    try:
        run_workers(
            workers,
            worker,
            shutdown_timeout=shutdown_timeout,
            stop=stop,
            started=lambda: _announce(registry, base_url, host, port, workers, store_url),
            hang_timeout=worker_timeout,
        )
    finally:
        reserved.close()
    stderr.print(
        f"{received[0] if received else 'stop'}: the workers finished their answers in flight",
        markup=False,
    )


def _announce(
    registry: Any, base_url: str, host: str, port: int, workers: int, store_url: str | None
) -> None:
    from edgereg.serve._workers import wait_listening

    if not wait_listening(host, port):
        log.error("no worker listens on %s yet", base_url)
    print_result(
        f"serving {registry.storage.url} on {base_url} with {workers} workers "
        "(Ctrl-C or SIGTERM to stop)"
    )
    if store_url is not None:
        print_note(f"reports: POST {base_url}/v1/reports into {store_url}")


def _start_pruning(store: Any, retention_days: int, stop: threading.Event) -> None:
    """While serving: mark the server's clock in the store every minute, prune every hour.

    The mark is the clock install ages are counted on when no report arrives
    (docs/operations/canary-analysis.md, "One clock").
    """
    import time
    from datetime import datetime, timedelta, timezone

    from edgereg.errors import StorageError

    def maintain() -> None:
        pruned_at = -PRUNE_INTERVAL
        while True:
            now = datetime.now(timezone.utc)
            try:
                store.mark_clock(now)
                if time.monotonic() - pruned_at >= PRUNE_INTERVAL:
                    pruned_at = time.monotonic()
                    store.prune(now - timedelta(days=retention_days))
            except StorageError as exc:  # the next pass tries again
                log.warning("maintaining the report store failed: %s", exc.message)
            if stop.wait(CLOCK_INTERVAL):
                return

    threading.Thread(target=maintain, name="edgereg-report-retention", daemon=True).start()
