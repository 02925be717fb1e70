"""One file from the hub into huggingface_hub's cache: resumed across runs, checked before it is used.

huggingface_hub (2.x) downloads to a fresh temporary file per call and deletes it when the call fails, so
an interrupted download starts over. Here the bytes go to `blobs/<etag>.incomplete`, kept on any failure
(a dropped connection, Ctrl-C, the hub going away); the next run asks the hub for the rest with a Range
request (huggingface_hub's own `http_get`, which also retries transient errors within a run). The file
becomes a blob only once its sha256 matches the hub's LFS metadata (the library does not check it).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from llamacy.errors import LlamacyError


class DownloadError(LlamacyError):
    """The transfer stopped; what arrived is kept and the next pull continues from it."""


class IntegrityError(LlamacyError):
    """A downloaded file does not match the hub's hash or size: it is deleted, never used."""


@dataclass(frozen=True)
class RemoteFile:
    """A repository file as the hub lists it (model_info with files_metadata)."""

    path: str
    size: int | None
    sha256: str | None  # LFS files
    blob_id: str | None  # the git object id, the only hash of a file stored in git itself


def _hash_file(path: Path, h: Any, prefix: bytes = b"") -> str:
    h.update(prefix)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def verify(path: Path, remote: RemoteFile, label: str) -> None:
    """Raise IntegrityError (after deleting `path`) unless it is exactly the file the hub lists."""
    size = path.stat().st_size
    problem = None
    if remote.size is not None and size != remote.size:
        problem = f"is truncated ({size} of {remote.size} bytes)" if size < remote.size else "is too long"
    elif remote.sha256:
        got = _hash_file(path, hashlib.sha256())
        if got != remote.sha256:
            problem = f"failed its sha256 check (expected {remote.sha256[:16]}…, got {got[:16]}…)"
    elif remote.blob_id:
        got = _hash_file(path, hashlib.sha1(), f"blob {size}\0".encode())
        if got != remote.blob_id:
            problem = f"failed its git hash check (expected {remote.blob_id[:16]}…, got {got[:16]}…)"
    if problem:
        path.unlink(missing_ok=True)
        raise IntegrityError(f"{label} {problem}; the download was removed, pull again")


def _bar_class(progress: Any, label: str) -> type:
    """A progress-bar class with the interface http_get drives (made with keyword arguments, a context
    manager, update(n)), drawing on a Rich Progress; None-progress gives a silent one."""

    class Bar:
        def __init__(self, *, total: int | None = None, initial: int = 0, **_: Any) -> None:
            self.task = None if progress is None else progress.add_task(label, total=total, completed=initial)

        def __enter__(self) -> Bar:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def update(self, n: int) -> None:
            if self.task is not None:
                progress.update(self.task, advance=n)

    return Bar


def _transport_errors() -> tuple[type[BaseException], ...]:
    # huggingface_hub's HTTP client; transfer failures surface as its TransportError subclasses.
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    return (httpx2.TransportError, HfHubHTTPError)


def fetch(
    repo_id: str, commit: str, remote: RemoteFile, storage: Path, *, endpoint: str, progress: Any = None
) -> Path:
    """The blob holding `remote` at `commit`, downloading (or finishing) it first when needed."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    label = f"{repo_id}/{remote.path}"
    url = hf_hub_url(repo_id, remote.path, revision=commit, endpoint=endpoint)
    meta = get_hf_file_metadata(url, endpoint=endpoint)
    if not meta.etag:
        raise LlamacyError(f"the hub sent no ETag for {label}; is HF_ENDPOINT a Hugging Face hub?")
    # The listing's size (LFS metadata) is the truth; the headers only fill in when it has none.
    size = remote.size if remote.size is not None else meta.size
    expected = RemoteFile(remote.path, size, remote.sha256, remote.blob_id)
    blob = storage / "blobs" / meta.etag
    if blob.is_file() and (size is None or blob.stat().st_size == size):
        return blob
    blob.parent.mkdir(parents=True, exist_ok=True)
    partial = blob.with_name(blob.name + ".incomplete")
    headers = build_hf_headers()
    # The hub redirects LFS files to a CDN with a signed URL; the token is for the hub only.
    if urlparse(meta.location).netloc != urlparse(url).netloc:
        headers.pop("authorization", None)
    lock = storage.parent / ".locks" / storage.name / f"{meta.etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    # The same lock huggingface_hub takes for this blob: two pulls of one file never append to one partial.
    with WeakFileLock(lock):
        if blob.is_file():
            return blob
        with open(partial, "ab") as f:
            done = f.tell()
            if size is not None and done > size:
                f.truncate(0)
                done = 0
            try:
                http_get(
                    meta.location,
                    f,
                    resume_size=done,
                    headers=headers,
                    expected_size=size,
                    displayed_filename=remote.path,
                    tqdm_class=_bar_class(progress, remote.path.rsplit("/", 1)[-1]),
                )
            except _transport_errors() as e:
                f.flush()
                have = os.fstat(f.fileno()).st_size
                total = f" of {size}" if size is not None else ""
                reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise DownloadError(
                    f"download of {label} stopped at {have}{total} bytes ({reason}); "
                    "run the same command again to continue from there"
                ) from None
            except OSError as e:
                if e.errno is not None:  # the disk, not the transfer: keep what arrived
                    raise LlamacyError(f"cannot write {partial}: {e.strerror}") from None
                # http_get's size check (no errno): verify() below says what is wrong and removes the file
        verify(partial, expected, label)
        os.replace(partial, blob)
    return blob
