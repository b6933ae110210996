"""A token bucket per client address, for ``POST /v1/reports`` (pure; the clock is passed in)."""

from __future__ import annotations

import ipaddress
import math
import threading
from collections import OrderedDict

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Addresses remembered at once; the least recently seen is forgotten first
#: (it comes back with a full bucket), so a flood of addresses cannot grow memory.
MAX_CLIENTS = 65536


def client_key(address: str) -> str:
    """The bucket of an address: itself for IPv4, its /64 for IPv6 (one host holds a /64)."""
    if ":" not in address:  # IPv4 as the socket gives it: nothing to normalise
        return address
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{parsed}/64", strict=False))
    return str(parsed)


class RateLimiter:
    """``rate`` requests per second per client, in bursts of up to ``burst``.

    Args:
        rate: Tokens added per second.
        burst: The bucket's size (what a client may send at once after a pause).
        max_clients: Buckets kept at once.
    """

    def __init__(self, rate: float, burst: int, *, max_clients: int = MAX_CLIENTS) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate = rate
        self.burst = burst
        self._max = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, address: str, now: float) -> float:
        """Spend one token of ``address``'s bucket.

        Returns:
            0.0 when allowed, else the seconds until a token is available.
        """
        key = client_key(address)
        with self._lock:
            tokens, last = self._buckets.pop(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + max(0.0, now - last) * self.rate)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / self.rate
            self._buckets[key] = (tokens, now)
            if len(self._buckets) > self._max:
                self._buckets.popitem(last=False)
            return wait


def retry_after(wait: float) -> str:
    """The Retry-After value (whole seconds, at least 1) for a wait."""
    return str(max(1, math.ceil(wait)))


_UNSEEN = object()

#: Prefix lengths a source is counted by: an IPv4 /24 (one site, one small NAT pool)
#: and an IPv6 /48 (one customer's allocation; a /64 is only one of its subnets).
IPV4_SOURCE_PREFIX = 24
IPV6_SOURCE_PREFIX = 48
#: New report tokens one source may bring per period, by default.
DEFAULT_TOKENS_PER_SOURCE = 200
#: The period of that cap, in seconds.
DEFAULT_SOURCE_PERIOD = 3600.0


def source_key(
    address: str, *, ipv4_prefix: int = IPV4_SOURCE_PREFIX, ipv6_prefix: int = IPV6_SOURCE_PREFIX
) -> str:
    """The network a report comes from, for the per-source caps and the evidence.

    An address that does not parse is its own source.
    """
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    prefix = ipv4_prefix if parsed.version == 4 else ipv6_prefix
    return str(ipaddress.ip_network(f"{parsed}/{prefix}", strict=False))


class SourceCaps:
    """At most ``tokens`` distinct report tokens per source network per ``period`` seconds.

    A forger's reports each need a fresh token to count as another device;
    capping new tokens per network caps the devices one network can fake,
    while a real device's repeated reports (the same token) are never
    capped. Windows are fixed (``floor(now / period)``); the sources
    remembered are bounded like the rate limiter's.

    The local peer (127.0.0.1 or ::1) is not capped: it is a reverse proxy on
    the same host, and capping it would cap every device behind it. Configure
    the proxy as trusted (``edgereg serve --trusted-proxy``) so each device's
    own network is capped instead. Any other loopback address (all of
    127.0.0.0/8 reaches this host) is a source like any other: a simulation
    gives each device its own.

    Args:
        tokens: New tokens per source per period.
        period: Seconds.
        ipv4_prefix: Prefix length of an IPv4 source.
        ipv6_prefix: Prefix length of an IPv6 source.
        max_sources: Sources remembered at once (least recently seen forgotten).
    """

    def __init__(
        self,
        tokens: int = DEFAULT_TOKENS_PER_SOURCE,
        period: float = DEFAULT_SOURCE_PERIOD,
        *,
        ipv4_prefix: int = IPV4_SOURCE_PREFIX,
        ipv6_prefix: int = IPV6_SOURCE_PREFIX,
        max_sources: int = MAX_CLIENTS,
    ) -> None:
        if tokens < 1 or period <= 0:
            raise ValueError("tokens must be at least 1 and period positive")
        if not 8 <= ipv4_prefix <= 32 or not 16 <= ipv6_prefix <= 128:
            raise ValueError("an IPv4 source prefix is 8 to 32 bits, an IPv6 one 16 to 128")
        self.tokens = tokens
        self.period = period
        self.ipv4_prefix = ipv4_prefix
        self.ipv6_prefix = ipv6_prefix
        self._max = max_sources
        self._seen: OrderedDict[str, tuple[int, set[str]]] = OrderedDict()
        self._lock = threading.Lock()
        # Address -> its source, remembered (parsing an address twice per report was a
        # tenth of a report's time); forgotten all at once when full, like a flood's.
        self._sources: dict[str, str | None] = {}

    def source(self, address: str) -> str | None:
        """The source network of an address; None for the local peer (a local proxy: unknown)."""
        found = self._sources.get(address, _UNSEEN)
        if found is not _UNSEEN:
            return found  # type: ignore[return-value]
        source = None
        if not _is_local_peer(address):
            source = source_key(address, ipv4_prefix=self.ipv4_prefix, ipv6_prefix=self.ipv6_prefix)
        if len(self._sources) >= self._max:
            self._sources.clear()
        self._sources[address] = source
        return source

    def take(self, address: str, token: str, now: float) -> float:
        """Count ``token`` against its source.

        Returns:
            0.0 when allowed (a token already counted this period always is),
            else the seconds until the source's window ends.
        """
        key = self.source(address)
        if key is None:
            return 0.0
        window = int(now // self.period)
        with self._lock:
            found = self._seen.pop(key, None)
            if found is None or found[0] != window:
                found = (window, set())
            tokens = found[1]
            wait = 0.0
            if token not in tokens:
                if len(tokens) >= self.tokens:
                    wait = (window + 1) * self.period - now
                else:
                    tokens.add(token)
            self._seen[key] = found
            if len(self._seen) > self._max:
                self._seen.popitem(last=False)
            return wait


def forwarded_client(peer: str, forwarded_for: str | None, trusted: tuple[Network, ...]) -> str:
    """The client address: the peer's, or, when the peer is a trusted proxy, from X-Forwarded-For.

    Only a configured proxy is believed (any client can write the header):
    the list is read from the right, skipping trusted proxies, and the first
    address that is not one is the client. Without trusted proxies, or from
    any other peer, the header is ignored.
    """
    if not trusted or not forwarded_for or not _in(peer, trusted):
        return peer
    for hop in reversed([part.strip() for part in forwarded_for.split(",")]):
        try:
            ipaddress.ip_address(hop)
        except ValueError:
            return peer  # a malformed chain: trust none of it
        if not _in(hop, trusted):
            return hop
    return peer


#: The addresses a reverse proxy on the same host connects from.
LOCAL_PEERS = frozenset({ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")})


def _is_local_peer(address: str) -> bool:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return parsed in LOCAL_PEERS


def _in(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(parsed in network for network in networks)
