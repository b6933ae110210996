"""The OpenAPI 3.1 document of ``edgereg serve``, built from the route table.

The parameter patterns are the ones the server enforces
(:mod:`edgereg.serve._routes`), so the document cannot drift from it.
"""

from __future__ import annotations

from typing import Any

from edgereg import __version__
from edgereg.serve import _routes as routes

_ERROR = {"$ref": "#/components/responses/Error"}
_REFUSED = {
    "description": "Refused: a link out of the registry, a private key, or a file under "
    "keys/ that is not one public key (the server log says which).",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
_JSON_DOC_SCHEMA = {"$ref": "#/components/schemas/Envelope"}


# Values from the example project's registry (models.toml in the edgereg repository).
_EXAMPLES = {
    "model": "digits",
    "tier": "high",
    "version": "1.0.0",
    "digest": "0" * 64,
    "keyid": "0" * 64,
}


def _param(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {
            "type": "string",
            "pattern": routes.PARAMETER_PATTERNS[name],
            "maxLength": routes.PARAMETER_MAX_LENGTHS[name],
        },
        "example": _EXAMPLES[name],
    }


def _header(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": description,
        "schema": {"type": "string"},
    }


_IF_NONE_MATCH = _header(
    "If-None-Match", "Entity tags the client holds; a match answers 304 Not Modified."
)
_RANGE = _header(
    "Range",
    "One byte range (bytes=first-last, bytes=first- or bytes=-suffix) to resume a download; "
    "several ranges or another unit get the whole blob.",
)
_IF_RANGE = _header("If-Range", "Honour Range only if the blob's ETag is this one.")


def _h(description: str, *, required: bool = True) -> dict[str, Any]:
    return {"description": description, "required": required, "schema": {"type": "string"}}


_CACHE = _h("Caching rule: short max-age for signed documents, immutable for blobs.")
_ETAG = _h("Strong entity tag: the quoted lowercase hex SHA-256 of the body.")


def _document_operation(
    route: routes.Route, summary: str, params: list[dict[str, Any]], media: str
) -> dict[str, Any]:
    ok_content: dict[str, Any] = (
        {media: {"schema": _JSON_DOC_SCHEMA}}
        if media == "application/json"
        else {media: {"schema": {"type": "string"}}}
    )
    return {
        "summary": summary,
        "operationId": f"get_{route.name}",
        "parameters": [*params, _IF_NONE_MATCH],
        "responses": {
            "200": {
                "description": "The stored bytes, exactly as signed.",
                "headers": {"ETag": _ETAG, "Cache-Control": _CACHE},
                "content": ok_content,
            },
            "304": {
                "description": "Not modified: the client's copy is current.",
                "headers": {"ETag": _ETAG, "Cache-Control": _CACHE},
            },
            "400": _ERROR,
            "403": _REFUSED,
            "404": _ERROR,
            "503": _ERROR,
        },
    }


def _head(get: dict[str, Any]) -> dict[str, Any]:
    """The HEAD twin of a GET operation: same statuses and headers, no bodies."""
    responses = {
        code: (
            {k: v for k, v in answer.items() if k != "content"}
            if "$ref" not in answer
            else {"description": "The error status, without a body."}
        )
        for code, answer in get["responses"].items()
        if code not in ("206", "416")
    }
    return {
        "summary": f"Headers only: {get['summary'][0].lower()}{get['summary'][1:]}",
        "operationId": get["operationId"].replace("get_", "head_", 1),
        "parameters": [p for p in get["parameters"] if p["name"] not in ("Range", "If-Range")],
        "responses": responses,
    }


def _report_schemas() -> dict[str, Any]:
    """The Report schema (from the one parser's model) and the schemas it refers to."""
    from edgereg.protocol.reports import Report

    schema = Report.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    return {**defs, "Report": schema}


def _report_operation() -> dict[str, Any]:
    from edgereg.protocol.reports import MAX_REPORT_BYTES

    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    retry = {"Retry-After": _h("Seconds to wait before sending again.")}
    return {
        "summary": "A device's report of how a release runs (docs/protocol.md, Reports endpoint).",
        "description": (
            f"One report, JSON, at most {MAX_REPORT_BYTES} bytes, with Content-Length. "
            "Parsed strictly: unknown keys are refused, and integers are written without a "
            "fraction (3, not 3.0). "
            "The latest report of an install (its token) replaces the earlier one, so a "
            "repeated report changes nothing. Never changes the registry. Answered 404 by a "
            "server started without a report store."
        ),
        "operationId": f"post_{routes.REPORTS.name}",
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Report"}}},
        },
        "responses": {
            "202": {
                "description": "Stored.",
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {"status": {"type": "string", "enum": ["accepted"]}},
                        }
                    }
                },
            },
            "400": {"description": "Not a valid report; the detail says where.", "content": error},
            "401": {
                "description": "The server's report authenticator (app attestation) refused "
                "the report.",
                "content": error,
            },
            "404": {"description": "This server keeps no reports.", "content": error},
            "411": {"description": "No Content-Length (or chunked).", "content": error},
            "413": {
                "description": f"Content-Length above {MAX_REPORT_BYTES}; the body is not read.",
                "content": error,
            },
            "415": {"description": "Not application/json.", "content": error},
            "422": {
                "description": "A valid report of something the registry never served (unit, "
                "tier, sequence, or the arm's version at that sequence); the detail starts "
                "with the reason code. Refused and counted, never stored "
                "(docs/operations/report-threats.md).",
                "content": error,
            },
            "429": {
                "description": "Too many reports from this address, or too many new report "
                "tokens from its network this period.",
                "headers": retry,
                "content": error,
            },
            "503": {
                "description": "The report store is down (manifests and blobs are still served).",
                "headers": retry,
                "content": error,
            },
        },
    }


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document (a JSON-ready dict)."""
    model = _param("model", "Model name.")
    paths: dict[str, Any] = {}

    def add(route: routes.Route, get: dict[str, Any], *, head: bool = True) -> None:
        paths[route.template] = {"get": get}
        if head:
            paths[route.template]["head"] = _head(get)

    add(
        routes.MANIFEST,
        _document_operation(
            routes.MANIFEST,
            "The signed manifest an app of one tier fetches.",
            [model, _param("tier", "Device tier name.")],
            "application/json",
        ),
    )
    add(
        routes.STATE,
        _document_operation(
            routes.STATE, "The signed rollout state of a model.", [model], "application/json"
        ),
    )
    add(
        routes.RELEASE,
        _document_operation(
            routes.RELEASE,
            "A signed release record (immutable once published).",
            [model, _param("version", "Semantic version.")],
            "application/json",
        ),
    )
    add(
        routes.KEY,
        _document_operation(
            routes.KEY,
            "A public key (PEM) whose id is the sha256 of the raw Ed25519 key.",
            [_param("keyid", "Key id: 64 lowercase hex characters.")],
            "application/x-pem-file",
        ),
    )
    blob_headers = {
        "ETag": _h('The quoted digest from the path: "<sha256 hex>".'),
        "Cache-Control": _h("public, max-age=31536000, immutable"),
        "Accept-Ranges": _h("bytes"),
    }
    binary = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    add(
        routes.BLOB,
        {
            "summary": "A content-addressed artifact; resumable with Range.",
            "operationId": f"get_{routes.BLOB.name}",
            "parameters": [
                _param("digest", "The blob's sha256, 64 lowercase hex characters."),
                _IF_NONE_MATCH,
                _RANGE,
                _IF_RANGE,
            ],
            "responses": {
                "200": {
                    "description": "The whole blob.",
                    "headers": blob_headers,
                    "content": binary,
                },
                "206": {
                    "description": "One byte range of the blob.",
                    "headers": {**blob_headers, "Content-Range": _h("bytes first-last/size")},
                    "content": binary,
                },
                "304": {
                    "description": "Not modified.",
                    "headers": {
                        "ETag": blob_headers["ETag"],
                        "Cache-Control": blob_headers["Cache-Control"],
                    },
                },
                "400": _ERROR,
                "403": _REFUSED,
                "404": _ERROR,
                "416": {
                    "description": "The range cannot be satisfied.",
                    "headers": {"Content-Range": _h("bytes */size")},
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                },
                "503": _ERROR,
            },
        },
    )
    paths[routes.REPORTS.template] = {"post": _report_operation()}
    add(
        routes.STATUS_PAGE,
        {
            "summary": "Read-only status page: models, rollouts, tiers, recent changes.",
            "operationId": f"get_{routes.STATUS_PAGE.name}",
            "responses": {
                "200": {
                    "description": "HTML page.",
                    "content": {"text/html": {"schema": {"type": "string"}}},
                },
                "503": _ERROR,
            },
        },
        head=False,
    )
    add(
        routes.HEALTHZ,
        {
            "summary": "Liveness and storage reachability.",
            "operationId": f"get_{routes.HEALTHZ.name}",
            "responses": {
                "200": {
                    "description": "Serving, and the storage answers.",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Health"}}
                    },
                },
                "503": {
                    "description": "The storage does not answer.",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Health"}}
                    },
                },
            },
        },
        head=False,
    )
    add(
        routes.METRICS,
        {
            "summary": "Prometheus text exposition: requests, bytes, status codes, latency.",
            "operationId": f"get_{routes.METRICS.name}",
            "responses": {
                "200": {
                    "description": "Metrics (text format 0.0.4).",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
            },
        },
        head=False,
    )
    add(
        routes.OPENAPI,
        {
            "summary": "This document.",
            "operationId": f"get_{routes.OPENAPI.name}",
            "parameters": [_IF_NONE_MATCH],
            "responses": {
                "200": {
                    "description": "OpenAPI 3.1 JSON.",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                "304": {"description": "Not modified."},
            },
        },
        head=False,
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "edgereg registry",
            "version": __version__,
            "description": (
                "Read-only HTTP over an edgereg registry. Paths are the registry layout, so a "
                "static web server or S3 behind a CDN serves the same URLs. Only GET and HEAD "
                "are allowed (405 with Allow otherwise), except POST /v1/reports, which takes "
                "device reports into the report store and never the registry. Signed documents "
                "are JSON envelopes (DSSE) verified by the client; the server does not change "
                "a byte."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": {
                **_report_schemas(),
                "Envelope": {
                    "type": "object",
                    "required": ["payload", "payloadType", "signatures"],
                    "properties": {
                        "payload": {"type": "string", "description": "base64 of the payload"},
                        "payloadType": {"type": "string"},
                        "signatures": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["keyid", "sig"],
                                "properties": {
                                    "keyid": {"type": "string"},
                                    "sig": {"type": "string"},
                                },
                            },
                        },
                    },
                },
                "Error": {
                    "type": "object",
                    "required": ["error", "detail"],
                    "properties": {"error": {"type": "string"}, "detail": {"type": "string"}},
                },
                "Health": {
                    "type": "object",
                    "required": ["status"],
                    "properties": {
                        "status": {"type": "string", "enum": ["ok", "unavailable"]},
                        "detail": {"type": "string"},
                    },
                },
            },
            "responses": {
                "Error": {
                    "description": "An error, as JSON (no body for HEAD).",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                },
            },
        },
    }
