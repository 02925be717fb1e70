"""Pulled models, read from huggingface_hub's cache (HF_HOME/hub): no network, no index of our own.

The cache layout is huggingface_hub's: `models--OWNER--REPO/{blobs,snapshots/COMMIT,refs}`; a snapshot
holds links to blobs named by their hash. A model counts as pulled when all of its files are in one
snapshot.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from llamacy.errors import UsageError
from llamacy.hub.names import HubRef, Variant, choose, group_variants


def cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def repo_dir(repo_id: str, cache: Path | None = None) -> Path:
    from huggingface_hub.file_download import repo_folder_name

    return (cache or cache_dir()) / repo_folder_name(repo_id=repo_id, repo_type="model")


@dataclass(frozen=True)
class PulledModel:
    repo_id: str
    commit: str
    variant: Variant
    paths: tuple[Path, ...]  # the snapshot's files, in part order

    @property
    def name(self) -> str:
        return f"{self.repo_id}:{self.variant.tag}"


def _snapshot_files(snapshot: Path) -> list[tuple[str, int]]:
    files = []
    for p in sorted(snapshot.rglob("*")):
        # A link whose blob is gone (deleted by hand) is no file: skip it rather than fail the listing.
        if p.is_file():
            files.append((p.relative_to(snapshot).as_posix(), p.stat().st_size))
    return files


def _snapshots(repo: Path) -> list[Path]:
    """The repo's snapshots, the one `refs/main` names first, then the newest."""
    snaps = repo / "snapshots"
    if not snaps.is_dir():
        return []
    try:
        main = (repo / "refs" / "main").read_text().strip()
    except OSError:
        main = None
    found = [p for p in snaps.iterdir() if p.is_dir()]
    return sorted(found, key=lambda p: (p.name != main, -p.stat().st_mtime))


def _repo_models(repo_id: str, repo: Path) -> list[PulledModel]:
    seen: set[tuple[str, ...]] = set()
    models = []
    for snap in _snapshots(repo):
        for v in group_variants(_snapshot_files(snap)):
            if v.files in seen:
                continue  # an older snapshot's copy of the same file
            seen.add(v.files)
            models.append(PulledModel(repo_id, snap.name, v, tuple(snap / f for f in v.files)))
    return models


def pulled_models(cache: Path | None = None) -> list[PulledModel]:
    """Every GGUF model in the cache, by repository then size."""
    root = cache or cache_dir()
    if not root.is_dir():
        return []
    models = []
    for repo in sorted(root.glob("models--*")):
        repo_id = repo.name[len("models--") :].replace("--", "/")
        models.extend(_repo_models(repo_id, repo))
    return models


def find_pulled(ref: HubRef, cache: Path | None = None) -> PulledModel | None:
    """The pulled model `ref` names, or None when it is not in the cache."""
    models = _repo_models(ref.repo_id, repo_dir(ref.repo_id, cache))
    if not models:
        return None
    try:
        v = choose([m.variant for m in models], ref, "in the cache")
    except UsageError:
        return None
    return next(m for m in models if m.variant == v)


def remove(model: PulledModel, cache: Path | None = None) -> int:
    """Delete a pulled model's files; blobs another snapshot still links to stay. Returns bytes freed."""
    repo = repo_dir(model.repo_id, cache)
    targets = {p.resolve() for p in model.paths}
    for p in model.paths:
        p.unlink(missing_ok=True)
    still_linked = {p.resolve() for snap in _snapshots(repo) for p in snap.rglob("*") if p.is_file()}
    freed = 0
    for blob in targets - still_linked:
        if blob.is_file():
            freed += blob.stat().st_size
            blob.unlink()
    # Empty directories left behind (the snapshot, a quant's sub-folder), and the whole repository once
    # nothing of it is left, refs and lock files included.
    for snap in _snapshots(repo):
        for d in sorted((d for d in snap.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
            if not any(d.iterdir()):
                d.rmdir()
        if not any(snap.iterdir()):
            snap.rmdir()
    if not _snapshots(repo) and not any(p.is_file() for p in (repo / "blobs").glob("*")):
        shutil.rmtree(repo, ignore_errors=True)
        shutil.rmtree(repo.parent / ".locks" / repo.name, ignore_errors=True)
    return freed
