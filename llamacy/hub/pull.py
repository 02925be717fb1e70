"""`pull`: list a repository on the hub, pick the GGUF file a name means, bring it into the cache."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from llamacy.errors import LlamacyError, UsageError
from llamacy.hub.download import RemoteFile, fetch
from llamacy.hub.names import HubRef, choose, group_variants
from llamacy.hub.store import PulledModel, cache_dir, find_pulled, repo_dir


@contextmanager
def _hub_errors(ref: HubRef, endpoint: str) -> Iterator[None]:
    """huggingface_hub's exceptions as one-line errors that say what to do."""
    import httpx2
    from huggingface_hub import errors

    try:
        yield
    except errors.GatedRepoError:
        raise LlamacyError(
            f"{ref.repo_id} is gated: accept its terms at {endpoint}/{ref.repo_id} and set HF_TOKEN"
        ) from None
    except errors.RepositoryNotFoundError:
        raise UsageError(
            f"no model repository {ref.repo_id} on {endpoint} (a private one needs HF_TOKEN)"
        ) from None
    except errors.RevisionNotFoundError:
        raise UsageError(f"{ref.repo_id} has no main branch on {endpoint}") from None
    except errors.LocalEntryNotFoundError:  # hf_hub_download lost the hub before linking a fetched file
        raise LlamacyError(
            f"lost the hub at {endpoint} while finishing {ref}; run the same command again"
        ) from None
    except errors.OfflineModeIsEnabled:
        raise LlamacyError(f"{ref} is not pulled and HF_HUB_OFFLINE forbids the network") from None
    except errors.HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "an error"
        raise LlamacyError(f"the hub at {endpoint} answered {status} for {ref}") from None
    except httpx2.TransportError as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise LlamacyError(f"cannot reach the hub at {endpoint}: {reason}") from None


@contextmanager
def _quiet_library() -> Iterator[None]:
    # huggingface_hub logs its retries as warnings on stderr; a pipe gets nothing, a terminal the bar.
    from huggingface_hub.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _progress() -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    )


def _remote_files(info: Any) -> dict[str, RemoteFile]:
    return {
        s.rfilename: RemoteFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None, s.blob_id)
        for s in info.siblings or []
    }


def pull(ref: HubRef, *, progress: bool = False) -> PulledModel:
    """Download the model `ref` names (all parts of a split one) unless the cache has it already."""
    from huggingface_hub import HfApi, constants, hf_hub_download

    endpoint = constants.ENDPOINT
    if constants.is_offline_mode():
        found = find_pulled(ref)
        if found is None:
            raise LlamacyError(f"{ref} is not pulled and HF_HUB_OFFLINE forbids the network")
        return found
    storage = repo_dir(ref.repo_id)
    with _quiet_library(), _hub_errors(ref, endpoint):
        try:
            info = HfApi(endpoint=endpoint).model_info(ref.repo_id, revision="main", files_metadata=True)
        except (ValueError, KeyError):  # a body that is not the hub's JSON (HF_ENDPOINT pointing elsewhere)
            raise LlamacyError(
                f"{endpoint} does not answer as a Hugging Face hub (check HF_ENDPOINT)"
            ) from None
        if not info.sha:
            raise LlamacyError(f"the hub at {endpoint} gave no commit for {ref.repo_id}")
        remote = _remote_files(info)
        variant = choose(group_variants((f.path, f.size or 0) for f in remote.values()), ref, "on the hub")
        with _progress() if progress else nullcontext() as bar:
            for name in variant.files:
                fetch(ref.repo_id, info.sha, remote[name], storage, endpoint=endpoint, progress=bar)
        # The blobs are in place: hf_hub_download only links them into the snapshot, its own layout.
        paths = tuple(
            Path(
                hf_hub_download(
                    ref.repo_id, name, revision=info.sha, endpoint=endpoint, cache_dir=cache_dir()
                )
            )
            for name in variant.files
        )
    # What `main` pointed at, so that the cache's own tools (and offline resolution) see the newest pull.
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(info.sha)
    return PulledModel(ref.repo_id, info.sha, variant, paths)
