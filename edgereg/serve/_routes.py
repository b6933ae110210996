"""The routes of ``edgereg serve``: URL shapes and the strict rules for their parameters.

A URL path is the registry key of the object it names, so the same client
works against ``edgereg serve``, a static web server or S3 behind a CDN.
Each parameter is checked against its rule (the same ones the wire format
uses) before any storage is touched; these patterns are also what the
OpenAPI document publishes.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass

from pydantic import StringConstraints

from edgereg.protocol import layout
from edgereg.protocol.fields import Name, Sha256
from edgereg.protocol.patterns import SHA256_PATTERN


def _pattern(annotated: object) -> str:
    for meta in typing.get_args(annotated)[1:]:
        if isinstance(meta, StringConstraints) and isinstance(meta.pattern, str):
            return meta.pattern
    raise TypeError(f"{annotated} has no pattern")  # pragma: no cover


#: A model or tier name (models.toml's rule).
NAME_PATTERN = _pattern(Name)
#: A blob digest: 64 lowercase hex characters.
DIGEST_PATTERN = _pattern(Sha256)
#: A key id: 64 lowercase hex characters (see edgereg.signing).
KEY_ID_PATTERN = SHA256_PATTERN
#: A semantic version (semver.org's pattern, ASCII digits only).
VERSION_PATTERN = (
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-((?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
    r"(?:\.(?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)

PARAMETER_PATTERNS = {
    "model": NAME_PATTERN,
    "tier": NAME_PATTERN,
    "digest": DIGEST_PATTERN,
    "keyid": KEY_ID_PATTERN,
    "version": VERSION_PATTERN,
}
PARAMETER_RULES = {
    "model": "a model name: a lowercase letter, then up to 62 lowercase letters, digits, "
    "'_' or '-'",
    "tier": "a tier name: a lowercase letter, then up to 62 lowercase letters, digits, '_' or '-'",
    "digest": "a sha256 digest: 64 lowercase hex characters",
    "keyid": "a key id: 64 lowercase hex characters",
    "version": "a semantic version like 1.2.0",
}
#: Longest value of each parameter: a name's rule caps it; a version is also a
#: file name, and file systems refuse names past 255 bytes.
PARAMETER_MAX_LENGTHS = {"model": 63, "tier": 63, "digest": 64, "keyid": 64, "version": 200}
_COMPILED = {name: re.compile(pattern, re.ASCII) for name, pattern in PARAMETER_PATTERNS.items()}


@dataclass(frozen=True)
class Route:
    """One kind of resource.

    Attributes:
        name: The metrics label and the OpenAPI operation id suffix.
        template: The OpenAPI path template; ``{x}`` is a parameter.
        shape: Matches any path of this kind, parameters loosely (one segment).
    """

    name: str
    template: str
    shape: re.Pattern[str]

    def key(self, params: dict[str, str]) -> str | None:
        """The registry key this route reads, or None for a built-in page."""
        if self.template.startswith(_REGISTRY_PREFIXES):
            return self.template[1:].format(**params)
        return None


_REGISTRY_PREFIXES = tuple(
    "/" + prefix
    for prefix in (
        layout.MANIFESTS_PREFIX,
        layout.BLOBS_PREFIX,
        layout.MODELS_PREFIX,
        layout.KEYS_PREFIX,
    )
)


def _route(name: str, template: str) -> Route:
    regex = re.escape(template)
    for param in PARAMETER_PATTERNS:
        regex = regex.replace(re.escape("{" + param + "}"), f"(?P<{param}>[^/]*)")
    return Route(name, template, re.compile(f"^{regex}$"))


STATUS_PAGE = _route("status_page", "/")
HEALTHZ = _route("healthz", "/healthz")
METRICS = _route("metrics", "/metrics")
OPENAPI = _route("openapi", "/openapi.json")
# The registry's own layout, served at the same paths.
MANIFEST = _route("manifest", "/" + layout.manifest_path("{model}", "{tier}"))
BLOB = _route("blob", "/" + layout.blob_path("{digest}"))
RELEASE = _route("release", "/" + layout.release_path("{model}", "{version}"))
STATE = _route("state", "/" + layout.state_path("{model}"))
KEY = _route("key", "/" + layout.public_key_path("{keyid}"))
#: Device reports (POST): never the registry, only the report store.
REPORTS = _route("reports", "/v1/reports")

ROUTES = (STATUS_PAGE, HEALTHZ, METRICS, OPENAPI, MANIFEST, BLOB, RELEASE, STATE, KEY, REPORTS)
#: Routes whose objects never change once written (content-addressed).
IMMUTABLE = frozenset({BLOB.name})
#: The metrics label of a request that matched no route.
OTHER = "other"


class BadParameter(ValueError):
    """A route matched but a parameter breaks its rule (answer 400)."""


def match(path: str) -> tuple[Route, dict[str, str]] | None:
    """Find the route of a decoded path and check its parameters.

    Returns:
        The route and its parameters, or None when no route has this shape.

    Raises:
        BadParameter: the shape matched but a parameter is malformed; the
            message states the rule.
    """
    for route in ROUTES:
        found = route.shape.match(path)
        if found is None:
            continue
        params = found.groupdict()
        for name, value in params.items():
            if len(value) > PARAMETER_MAX_LENGTHS[name]:
                raise BadParameter(
                    f"{name} is {len(value)} characters long; at most "
                    f"{PARAMETER_MAX_LENGTHS[name]} are allowed"
                )
            if not _COMPILED[name].fullmatch(value) or not value.isascii():
                raise BadParameter(f"{name} {value[:80]!r} is not {PARAMETER_RULES[name]}")
        return route, params
    return None
