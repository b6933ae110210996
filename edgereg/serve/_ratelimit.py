"""A token bucket per client address, for ``POST /v1/reports`` (pure; the clock is passed in)."""

from __future__ import annotations

import ipaddress
import math
import threading
from collections import OrderedDict

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
