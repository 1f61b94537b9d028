"""S3Store: payloads in an S3 (or S3-compatible: MinIO, R2, Ceph, moto) bucket via obstore.

All configuration is passed in; fleetserve reads no environment variables here.
obstore itself (the Rust ``object_store`` builder) reads ``AWS_*`` variables for any
setting left unset (``AWS_ENDPOINT_URL``, ``AWS_VIRTUAL_HOSTED_STYLE_REQUEST``, ...),
so this store pins what decides where requests go and how they are signed:

- the region (default ``us-east-1``) and the endpoint (default
  ``https://s3.<region>.amazonaws.com``; pass it for China regions), path-style
  addressing, signing on, and
  ``allow_http`` (on for an ``http://`` endpoint);
- given ``access_key_id`` and ``secret_access_key``, a static credential provider, so
  ``AWS_SESSION_TOKEN``, profile or instance-role credentials are not mixed in.
  Leave them out to use obstore's own chain (environment, web identity, ECS/EC2
  instance metadata), which is what a cloud deployment with an IAM role wants.

Settings that only add to a request (server-side encryption, checksums, requester
pays) may still come from the environment; that is the operator's choice.

S3 reports last-modified times in whole seconds, so :meth:`S3Store.sweep` may remove
an object up to a second before ``max_age``.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from .base import PayloadMissing, check_key, check_max_age, is_expired

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config, S3Credential
    from obstore.store import S3Store as ObstoreS3

DELETE_BATCH = 1000  # the most keys one S3 DeleteObjects call takes
DEFAULT_REGION = "us-east-1"


def _require_obstore() -> None:
    try:
        import obstore  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            "s3:// payload stores need obstore; install the extra: pip install 'fleetserve[nats]'"
        ) from exc


def redact_endpoint(endpoint: str) -> str:
    """The endpoint without user:password, for logs."""
    parts = urlsplit(endpoint)
    if parts.username is None and parts.password is None:
        return endpoint
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


class S3Store:
    """Payloads under ``s3://<bucket>/<prefix>/``.

    ``allow_http`` defaults to whether ``endpoint`` is ``http://``. ``timeout`` bounds
    each request and ``max_retries`` how often obstore retries one (within
    ``retry_timeout``); both are tighter than obstore's defaults because a payload
    read sits on a request's critical path.
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        allow_http: bool | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        retry_timeout: float = 20.0,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"S3 bucket name {bucket!r} is empty or contains '/'")
        if (access_key_id is None) != (secret_access_key is None):
            raise ValueError("give both s3 access_key_id and secret_access_key, or neither")
        _require_obstore()
        from obstore.store import S3Store as ObstoreS3

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            check_key(self.prefix)
        self.endpoint = endpoint
        if allow_http is None:
            allow_http = bool(endpoint) and urlsplit(endpoint or "").scheme == "http"
        region = region or DEFAULT_REGION
        config: S3Config = {
            "region": region,
            "endpoint": endpoint or f"https://s3.{region}.amazonaws.com",
            "virtual_hosted_style_request": False,
            "skip_signature": False,
        }
        client: ClientConfig = {"allow_http": allow_http, "timeout": timedelta(seconds=timeout)}
        retry: RetryConfig = {
            "max_retries": max_retries,
            "retry_timeout": timedelta(seconds=retry_timeout),
        }
        provider = None
        if access_key_id is not None and secret_access_key is not None:
            credential: S3Credential = {
                "access_key_id": access_key_id,
                "secret_access_key": secret_access_key,
                "token": session_token,
                "expires_at": None,
            }
            provider = _StaticCredentials(credential)
        self._store: ObstoreS3 | None = ObstoreS3(
            bucket,
            prefix=self.prefix or None,
            config=config,
            client_options=client,
            retry_config=retry,
            credential_provider=provider,
        )

    @property
    def url(self) -> str:
        url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        if self.endpoint:
            url += f"?endpoint={redact_endpoint(self.endpoint)}"
        return url

    def __repr__(self) -> str:
        return f"S3Store({self.url!r})"

    @property
    def objects(self) -> ObstoreS3:
        """The underlying obstore store (for bulk reads such as model downloads)."""
        return self._live()

    def _live(self) -> ObstoreS3:
        if self._store is None:
            raise RuntimeError(f"payload store {self.url} is closed")
        return self._store

    async def put(self, key: str, data: bytes) -> None:
        import obstore

        await obstore.put_async(self._live(), check_key(key), data)

    async def get(self, key: str) -> bytes:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            result = await obstore.get_async(self._live(), check_key(key))
            return bytes(await result.bytes_async())
        except (FileNotFoundError, NotFoundError):  # obstore 0.12 raises the builtin
            raise PayloadMissing(key, self.url) from None

    async def delete(self, key: str) -> None:
        import obstore
        from obstore.exceptions import NotFoundError

        # S3 answers 204 for a missing key; other S3-compatible servers may say 404
        with contextlib.suppress(FileNotFoundError, NotFoundError):
            await obstore.delete_async(self._live(), check_key(key))

    async def sweep(self, max_age: float) -> int:
        """List everything under the prefix, then delete the old objects in batches."""
        import obstore

        check_max_age(max_age)
        store = self._live()
        old: list[str] = []
        async for batch in obstore.list(store, chunk_size=DELETE_BATCH):
            old.extend(m["path"] for m in batch if is_expired(m["last_modified"], max_age))
        for i in range(0, len(old), DELETE_BATCH):
            await obstore.delete_async(store, old[i : i + DELETE_BATCH])
        return len(old)

    async def close(self) -> None:
        """obstore pools connections per store; dropping the store releases them."""
        self._store = None


class _StaticCredentials:
    """An obstore credential provider that always returns the same keys."""

    def __init__(self, credential: S3Credential) -> None:
        self._credential = credential

    def __call__(self) -> S3Credential:
        return self._credential

    def __repr__(self) -> str:
        return "_StaticCredentials(<redacted>)"
