"""The S3 backend (AWS or any S3-compatible store), through boto3.

boto3 is imported here only, and only when the first request is made, so
``edgereg`` works without it for local registries.

Writes use S3 conditional requests (AWS since 2024-08/11; MinIO, R2, Ceph,
moto >= 5.0.15 as well):

* write once: ``PutObject`` / ``CompleteMultipartUpload`` with
  ``If-None-Match: *``; a 412 means the object exists and nothing changed.
* compare-and-swap: ``PutObject`` with ``If-Match: <etag>`` (or
  ``If-None-Match: *`` when the object must not exist yet); 412, a 409
  ``ConditionalRequestConflict`` or a 404 become :class:`ConflictError`.

A store that silently ignores these headers would turn both into plain
overwrites: harmless for content-addressed blobs, not for the rollout state
(two rollouts at once would both succeed and one change would vanish). So
before the first write a process proves it once per store
(:meth:`S3Storage._check_conditional_writes`): an ``If-None-Match: *`` PUT
on an object that exists, and an ``If-Match`` PUT with a wrong ETag, must
both be refused. A store that accepts either, or answers 501, is refused
with a non-retryable error.

Objects carry ``Content-Type`` (``application/json`` for documents,
``application/x-pem-file`` for keys, ``application/octet-stream`` for blobs)
and ``Cache-Control`` (the same rules ``edgereg serve`` sends), so a CDN in
front of the bucket needs no per-path header rules.

Large files go up as a multipart upload of file slices read from disk by a
few threads, so memory stays at a few buffers whatever the file size.
boto3's ``upload_file`` cannot be used for this: its transfer manager does
not pass ``IfNoneMatch`` to ``CompleteMultipartUpload``.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import logging
import os
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, BinaryIO

from edgereg.errors import StorageError
from edgereg.protocol import layout
from edgereg.storage import Stamp, Storage, validate_key

MiB = 1024 * 1024
_MAX_PARTS = 10_000
_MIN_PART_SIZE = 5 * MiB  # S3's lower bound for every part but the last

_CREDENTIALS_HINT = (
    "Check the credentials boto3 finds (AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY, or ~/.aws/credentials) and that they may read, write "
    "and list the bucket."
)
_ENDPOINT_HINT = (
    "Check the network and the endpoint (--endpoint-url, EDGEREG_S3_ENDPOINT_URL "
    "or AWS_ENDPOINT_URL for an S3-compatible store)."
)
_ACCESS_CODES = {
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "403",
}
log = logging.getLogger(__name__)

_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_NOT_IMPLEMENTED_CODES = {"NotImplemented", "501"}
_CONDITIONAL_HINT = (
    "edgereg needs S3 conditional writes (PutObject with If-None-Match and If-Match) so that "
    "two publishers at once cannot lose a change. Use a store that implements them (AWS S3, "
    "MinIO, Cloudflare R2, Ceph RGW), or a directory registry (file://) on one machine."
)
#: Where the conditional-write probe writes, under the registry prefix. The
#: reserved ``.lock-`` prefix keeps it out of listings and static hosting.
PROBE_KEY = ".lock-conditional-write-probe"
_PROBE_BODY = b"written by edgereg to check that this store honours conditional writes\n"
_WRONG_ETAG = '"00000000000000000000000000000000"'
# (endpoint, bucket) -> None when proven; an error when the store cannot be trusted.
_probed: dict[tuple[str | None, str], StorageError | None] = {}
_probe_lock = threading.Lock()

IMMUTABLE_CACHE = "public, max-age=31536000, immutable"
DOCUMENT_CACHE = "public, max-age=60"


def object_headers(key: str) -> dict[str, str]:
    """``ContentType`` and ``CacheControl`` for a registry key (boto3 argument names).

    The same rules as ``edgereg serve``: blobs never change, signed documents
    are reused for at most 60 seconds, the rest is not cached.
    """
    if key.startswith(layout.BLOBS_PREFIX):
        return {"ContentType": "application/octet-stream", "CacheControl": IMMUTABLE_CACHE}
    if layout.is_public_key_path(key):
        return {"ContentType": "application/x-pem-file", "CacheControl": DOCUMENT_CACHE}
    if key.endswith(".json"):
        cache = (
            DOCUMENT_CACHE
            if key.startswith((layout.MANIFESTS_PREFIX, layout.MODELS_PREFIX))
            else "no-cache"
        )
        return {"ContentType": "application/json", "CacheControl": cache}
    return {"ContentType": "application/octet-stream", "CacheControl": "no-cache"}


def _status(exc: BaseException) -> int | None:
    """The HTTP status of a botocore ClientError, else None."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


def _code(exc: BaseException) -> str | None:
    """Return the S3 error code of a botocore ClientError, else None."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    return str(code) if code is not None else None


class S3Storage(Storage):
    """A registry under ``s3://bucket/prefix``.

    Args:
        bucket: The bucket name.
        prefix: Key prefix of the registry root inside the bucket ('' for the top).
        endpoint_url: Endpoint of an S3-compatible store, or None for AWS.
        multipart_threshold: Files at least this large are uploaded in parts.
        part_size: Size of each part (raised when a file would need more than
            10,000 parts).
        max_concurrency: Parts uploaded at the same time.
        connect_timeout: Seconds to wait for a TCP connection.
        read_timeout: Seconds to wait for a response to arrive.
        max_attempts: Attempts per request, including the first: an
            unreachable endpoint fails within roughly
            ``max_attempts * connect_timeout`` seconds.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        multipart_threshold: int = 8 * MiB,
        part_size: int = 8 * MiB,
        max_concurrency: int = 8,
        connect_timeout: float = 3.0,
        read_timeout: float = 60.0,
        max_attempts: int = 2,
    ) -> None:
        if part_size < _MIN_PART_SIZE:
            raise ValueError(f"part_size must be at least {_MIN_PART_SIZE} bytes (S3's minimum)")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.multipart_threshold = max(multipart_threshold, 1)
        self.part_size = part_size
        self.max_concurrency = max(max_concurrency, 1)
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_attempts = max_attempts
        self._client_lock = threading.Lock()
        self._client_obj: Any = None
        self._bucket_seen = False

    # -- client -----------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The boto3 S3 client (created on first use; thread-safe)."""
        with self._client_lock:
            if self._client_obj is None:
                import boto3  # type: ignore[import-untyped]
                from botocore.config import Config  # type: ignore[import-untyped]

                session = boto3.session.Session()
                config = Config(
                    connect_timeout=self._connect_timeout,
                    read_timeout=self._read_timeout,
                    retries={"max_attempts": self._max_attempts, "mode": "standard"},
                    max_pool_connections=max(10, self.max_concurrency + 2),
                    # S3-compatible stores rarely have wildcard DNS for buckets.
                    s3={"addressing_style": "path"} if self.endpoint_url else None,
                )
                self._client_obj = session.client(
                    "s3",
                    endpoint_url=self.endpoint_url,
                    region_name=session.region_name or "us-east-1",
                    config=config,
                )
            return self._client_obj

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    # -- reads ------------------------------------------------------------------------

    def _get_object(self, key: str, **extra: Any) -> Any:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key), **extra)
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                raise self._not_found(key) from exc
            raise

    def _get(self, key: str) -> bytes:
        return self._get_versioned(key)[0]

    def _get_versioned(self, key: str) -> tuple[bytes, str]:
        response = self._get_object(key)
        with contextlib.closing(self._field(response, "Body", key)) as body:
            data: bytes = body.read()
        return data, self._etag(response, key)

    def _get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            response = self._get_object(key, Range=f"bytes={start}-{start + length - 1}")
        except Exception as exc:
            if _code(exc) == "InvalidRange":  # start is past the end
                return b""
            raise
        with contextlib.closing(self._field(response, "Body", key)) as body:
            data: bytes = body.read()
        return data

    def _open_read(self, key: str) -> Any:
        return self._field(self._get_object(key), "Body", key)

    def _head(self, key: str) -> Any:
        """Return head_object's response, or None if the object does not exist."""
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if _code(exc) not in ("404", "NoSuchKey", "NotFound"):
                raise
            # HEAD has no body, so a missing bucket also looks like a plain 404.
            self._check_bucket()
            return None
        self._bucket_seen = True
        return response

    def _check_bucket(self) -> None:
        if self._bucket_seen:
            return
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            if _code(exc) in ("404", "NoSuchBucket", "NotFound"):
                raise self._no_bucket() from exc
            raise
        self._bucket_seen = True

    # An object's stamp is its ETag: S3 reads are strongly consistent, so once a
    # write is answered every HEAD and GET sees the new ETag. A stamp check is
    # one HEAD: no body, and no hashing of it.
    def _get_stamped(self, key: str) -> tuple[bytes, Stamp | None]:
        return self._get_versioned(key)

    def _size_stamped(self, key: str) -> tuple[int, Stamp | None]:
        response = self._head(key)
        if response is None:
            raise self._not_found(key)
        return self._content_length(response, key), self._etag(response, key)

    def _stamp(self, key: str) -> Stamp | None:
        response = self._head(key)
        if response is None:
            raise self._not_found(key)
        return self._etag(response, key)

    def _exists(self, key: str) -> bool:
        return self._head(key) is not None

    def _size(self, key: str) -> int:
        response = self._head(key)
        if response is None:
            raise self._not_found(key)
        return self._content_length(response, key)

    def _content_length(self, response: Any, key: str) -> int:
        size = self._field(response, "ContentLength", key)
        if not isinstance(size, int) or size < 0:
            raise self._malformed("ContentLength", key)
        return size

    def _list(self, prefix: str) -> builtins.list[str]:
        root = f"{self.prefix}/" if self.prefix else ""
        paginator = self.client.get_paginator("list_objects_v2")
        keys = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=root + prefix):
            for item in page.get("Contents", ()):
                name = item.get("Key") if isinstance(item, dict) else None
                if not isinstance(name, str):
                    raise self._malformed("Key", prefix or "/")
                key = name[len(root) :]
                try:
                    validate_key(key)
                except ValueError:
                    continue  # "folder/" markers and keys other tools wrote
                keys.append(key)
        return keys

    # -- writes -----------------------------------------------------------------------

    def _put_if_absent(self, key: str, data: bytes) -> bool:
        return self._create(
            key,
            lambda: self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(key),
                Body=data,
                IfNoneMatch="*",
                **object_headers(key),
            ),
        )

    def _put_file_if_absent(self, key: str, path: Path) -> bool:
        if self._exists(key):
            return False  # costs one HEAD, uploads nothing
        size = path.stat().st_size
        if size < self.multipart_threshold:
            with path.open("rb") as f:
                return self._create(key, lambda: self._put_stream(key, f))
        return self._multipart_if_absent(key, path, size)

    def _put_stream(self, key: str, f: BinaryIO) -> Any:
        f.seek(0)  # a retry after a 409 sends the file again
        return self.client.put_object(
            Bucket=self.bucket, Key=self._key(key), Body=f, IfNoneMatch="*", **object_headers(key)
        )

    def _create(self, key: str, send: Any) -> bool:
        """Run a conditional create; True if it created the object, False if it existed.

        A 409 means another conditional write to the same key was in flight:
        try again, and the loser of that race then sees 412 (exists).
        """
        for attempt in range(4):
            try:
                send()
                self._bucket_seen = True
                return True
            except Exception as exc:
                code = _code(exc)
                if code in ("PreconditionFailed", "412"):
                    return False
                if code not in ("ConditionalRequestConflict", "409"):
                    raise
            log.info(
                "409 creating %s: another write to it was in flight (attempt %d of 4); retrying",
                self._key(key),
                attempt + 1,
            )
            time.sleep(0.05 * 2**attempt)
        raise self._conflict(key, None)

    def _multipart_if_absent(self, key: str, path: Path, size: int) -> bool:
        client = self.client
        full_key = self._key(key)
        part_size = max(self.part_size, -(-size // _MAX_PARTS))
        count = -(-size // part_size)
        # CRC32 per part, checked by S3 and combined into the object's checksum
        # on completion (what boto3's upload_file does too).
        upload_id = self._field(
            client.create_multipart_upload(
                Bucket=self.bucket, Key=full_key, ChecksumAlgorithm="CRC32", **object_headers(key)
            ),
            "UploadId",
            key,
        )
        finished = False

        def send(number: int) -> dict[str, Any]:
            offset = (number - 1) * part_size
            length = min(part_size, size - offset)
            with path.open("rb") as f:
                response = client.upload_part(
                    Bucket=self.bucket,
                    Key=full_key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=_FileSlice(f, offset, length),
                    ContentLength=length,
                    ChecksumAlgorithm="CRC32",
                )
            part = {"PartNumber": number, "ETag": self._etag(response, key)}
            if "ChecksumCRC32" in response:
                part["ChecksumCRC32"] = response["ChecksumCRC32"]
            return part

        try:
            with ThreadPoolExecutor(min(self.max_concurrency, count)) as pool:
                futures = [pool.submit(send, n) for n in range(1, count + 1)]
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                failed = [f for f in done if f.exception() is not None]
                if failed:
                    for future in futures:
                        future.cancel()
                    failed[0].result()  # raises
                parts = [f.result() for f in futures]
            try:
                client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=full_key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                    IfNoneMatch="*",
                )
            except Exception as exc:
                code = _code(exc)
                if code in ("PreconditionFailed", "412"):
                    return False  # someone else finished the same key first
                if code in ("ConditionalRequestConflict", "409"):
                    # Another upload of this key completed meanwhile: per AWS
                    # the loser restarts; for an immutable key, existing is enough.
                    if self._head(key) is not None:
                        log.info(
                            "409 completing the upload of %s: another upload finished it "
                            "first; keeping that one (the key is immutable)",
                            full_key,
                        )
                        return False
                    raise self._conflict(key, None) from exc
                raise
            finished = True
            self._bucket_seen = True
            return True
        finally:
            if not finished:
                # Parts of an unfinished upload are billed until aborted.
                with contextlib.suppress(Exception):
                    client.abort_multipart_upload(
                        Bucket=self.bucket, Key=full_key, UploadId=upload_id
                    )

    def _put_if_unchanged(self, key: str, data: bytes, token: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if token is None else {"IfMatch": token}
        try:
            response = self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(key),
                Body=data,
                **condition,
                **object_headers(key),
            )
        except Exception as exc:
            code = _code(exc)
            # NoSuchKey: If-Match on an object someone deleted meanwhile.
            if code in _CONFLICT_CODES or (token is not None and code == "NoSuchKey"):
                raise self._conflict(key, token) from exc
            raise
        self._bucket_seen = True
        return self._etag(response, key)

    def _put(self, key: str, data: bytes) -> None:
        self.client.put_object(
            Bucket=self.bucket, Key=self._key(key), Body=data, **object_headers(key)
        )
        self._bucket_seen = True

    def _etag(self, response: Any, key: str) -> str:
        etag = self._field(response, "ETag", key)
        if not isinstance(etag, str) or not etag:
            raise self._malformed("ETag", key)
        return etag

    def _field(self, response: Any, name: str, key: str) -> Any:
        """``response[name]``; a store that left it out is a storage error, not a bug."""
        value = response.get(name) if isinstance(response, dict) else None
        if value is None:
            raise self._malformed(name, key)
        return value

    def _malformed(self, name: str, key: str) -> StorageError:
        return StorageError(
            f"the S3 store{self._where()} answered for '{key}' without a valid {name}",
            url=self.url,
            hint="edgereg needs an S3-compatible store that answers as S3 does; check the "
            "endpoint (--endpoint-url, EDGEREG_S3_ENDPOINT_URL).",
            retryable=False,
        )

    # -- the conditional-write probe ----------------------------------------------------

    def _check_conditional_writes(self) -> None:
        """Prove once per process and store that conditional PUTs are honoured.

        Three small PUTs of :data:`PROBE_KEY`: make sure it exists, then an
        ``If-None-Match: *`` and an ``If-Match`` with a wrong ETag, which must
        both be refused (412). Network failures are not cached (the next
        write tries again); a verdict is.
        """
        cache_key = (self.endpoint_url, self.bucket)
        with _probe_lock:
            if cache_key not in _probed:
                _probed[cache_key] = self._probe()
            verdict = _probed[cache_key]
        if verdict is not None:
            raise verdict

    def _probe(self) -> StorageError | None:
        key = self._key(PROBE_KEY)

        def put(**condition: str) -> bool:
            """True if the store accepted the write, False if it refused it (412/409)."""
            try:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=_PROBE_BODY,
                    ContentType="text/plain",
                    CacheControl="no-store",
                    **condition,
                )
            except Exception as exc:
                if _code(exc) in _CONFLICT_CODES:
                    return False
                raise
            self._bucket_seen = True
            return True

        try:
            put(IfNoneMatch="*")  # created now, or it was there: either way it exists
            if put(IfNoneMatch="*"):
                return self._not_honoured("If-None-Match: * on an object that exists")
            if put(IfMatch=_WRONG_ETAG):
                return self._not_honoured("If-Match with an ETag the object does not have")
        except Exception as exc:
            code, status = _code(exc), _status(exc)
            if code in _ACCESS_CODES or code == "NoSuchBucket" or status in (403, 404):
                raise  # the usual errors, with their usual advice
            if (
                code in _NOT_IMPLEMENTED_CODES
                or status == 501
                or (status is not None and 400 <= status < 500)
            ):
                # Some stores answer 400 (InvalidArgument, ...) to headers they lack.
                return StorageError(
                    f"the S3 store{self._where()} does not implement conditional writes "
                    f"(it answered {status or '?'} {code or ''} to a PUT with If-None-Match "
                    f"or If-Match); registry {self.url} cannot be written safely",
                    url=self.url,
                    hint=_CONDITIONAL_HINT,
                    retryable=False,
                )
            raise
        return None

    def _not_honoured(self, what: str) -> StorageError:
        return StorageError(
            f"the S3 store{self._where()} accepted a PUT with {what}, which it must refuse: "
            f"it ignores conditional writes, so two publishers at once would silently lose "
            f"a change; registry {self.url} is not written",
            url=self.url,
            hint=_CONDITIONAL_HINT,
            retryable=False,
        )

    def _delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    # -- errors -----------------------------------------------------------------------

    def _where(self) -> str:
        return f" at {self.endpoint_url}" if self.endpoint_url else ""

    def _no_bucket(self) -> StorageError:
        return StorageError(
            f"S3 bucket '{self.bucket}' does not exist{self._where()} (registry {self.url})",
            url=self.url,
            hint="Check the bucket name in the registry URL, and the endpoint "
            "(--endpoint-url, EDGEREG_S3_ENDPOINT_URL) if it is on an S3-compatible store.",
            retryable=False,
        )

    def _translate(self, exc: Exception, operation: str, key: str) -> StorageError:
        if isinstance(exc, ImportError):
            return StorageError(
                f"registry {self.url} needs boto3, which is not installed ({exc})",
                url=self.url,
                hint="Install it: pip install boto3",
                retryable=False,
            )
        code = _code(exc)
        name = type(exc).__name__
        if code == "NoSuchBucket":
            return self._no_bucket()
        if code in _NOT_IMPLEMENTED_CODES or _status(exc) == 501:
            return StorageError(
                f"the S3 store{self._where()} does not implement what edgereg asked while "
                f"trying to {operation} '{key}' ({code or 501}): {exc}",
                url=self.url,
                hint=_CONDITIONAL_HINT if operation == "write" else _ENDPOINT_HINT,
                retryable=False,
            )
        if code in _ACCESS_CODES:
            return StorageError(
                f"access to S3 bucket '{self.bucket}' was denied{self._where()} "
                f"while trying to {operation} '{key}' ({code})",
                url=self.url,
                hint=_CREDENTIALS_HINT,
                retryable=False,
            )
        if name in ("NoCredentialsError", "PartialCredentialsError", "NoAuthTokenError"):
            return StorageError(
                f"no usable AWS credentials for registry {self.url}: {exc}",
                url=self.url,
                hint=_CREDENTIALS_HINT,
                retryable=False,
            )
        if name in (
            "EndpointConnectionError",
            "ConnectTimeoutError",
            "ConnectionClosedError",
            "ReadTimeoutError",
            "ProxyConnectionError",
            "SSLError",
        ):
            endpoint = self.endpoint_url or "AWS S3"
            return StorageError(
                f"could not reach S3 endpoint {endpoint} for registry {self.url} "
                f"while trying to {operation} '{key}': {exc}",
                url=self.url,
                hint=_ENDPOINT_HINT,
            )
        if isinstance(exc, ValueError) and "endpoint" in str(exc).lower():
            return StorageError(
                f"invalid S3 endpoint URL {self.endpoint_url!r}: {exc}",
                url=self.url,
                hint=_ENDPOINT_HINT,
                retryable=False,
            )
        error = super()._translate(exc, operation, key)
        status = _status(exc)
        if (status is not None and status >= 500) or (code is not None and code.startswith("5")):
            error.hint = _ENDPOINT_HINT
        elif code is not None:
            error.hint = _CREDENTIALS_HINT
        return error


class _FileSlice(io.RawIOBase):
    """A read-only, seekable view of ``length`` bytes of ``f`` from ``offset``.

    botocore reads it in small blocks (and seeks back to compute a checksum or
    to retry), so a part is never held in memory whole.
    """

    def __init__(self, f: BinaryIO, offset: int, length: int) -> None:
        super().__init__()
        self._f = f
        self._offset = offset
        self._length = length
        self._pos = 0
        f.seek(offset)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def __len__(self) -> int:
        return self._length

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._length}[whence]
        self._pos = min(max(base + pos, 0), self._length)
        self._f.seek(self._offset + self._pos)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        remaining = self._length - self._pos
        if size is None or size < 0 or size > remaining:
            size = remaining
        if size == 0:
            return b""
        data = self._f.read(size)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
