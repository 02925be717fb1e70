"""Hub model names (`OWNER/REPO[:QUANT]`) and which of a repository's GGUF files a name means.

Pure functions over file lists: the same rules pick a file from the hub's listing when pulling and from
the local cache when a pulled name is used offline, so both always agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from llamacy.errors import UsageError
from llamacy.memory import human_size

# Hugging Face repository ids: owner/name, letters, digits, '.', '_' and '-'.
_REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# The quant label llama.cpp's tools put in file names (Q4_K_M, q8_0, IQ2_XXS, BF16, ...). A label must
# not touch other letters or digits, so "Qwen2" or "IQ4" inside a longer word never count.
QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])(I?Q[1-8](?:_[A-Za-z0-9]{1,4})*|BF16|F16|F32|TQ[12]_0|MXFP4(?:_MOE)?)(?![A-Za-z0-9])",
    re.IGNORECASE,
)
DEFAULT_QUANT = "Q4_K_M"
# Files in GGUF repositories that are not language models.
_NOT_MODELS = ("mmproj", "imatrix")


@dataclass(frozen=True)
class HubRef:
    """A model on the hub: a repository and, optionally, which of its files (a quant or a file name)."""

    repo_id: str
    tag: str | None = None

    def __str__(self) -> str:
        return f"{self.repo_id}:{self.tag}" if self.tag else self.repo_id


def parse_ref(text: str) -> HubRef | None:
    """`OWNER/REPO[:QUANT]` as a HubRef, or None when the text is not in that form (a path, say)."""
    repo, colon, tag = text.partition(":")
    if not _REPO_RE.fullmatch(repo) or ".." in repo or (colon and not _TAG_RE.fullmatch(tag)):
        return None
    # "models/foo.gguf" is a file path that does not exist, not a repository called foo.gguf.
    if not tag and repo.lower().endswith(".gguf"):
        return None
    return HubRef(repo, tag or None)


def quant_label(filename: str) -> str | None:
    """The quant label a GGUF file name carries, upper-cased (the last one, where quants are named)."""
    base = filename.rsplit("/", 1)[-1]
    base = SPLIT_RE.sub("", base)
    base = re.sub(r"\.gguf$", "", base, flags=re.IGNORECASE)
    found = QUANT_RE.findall(base)
    return found[-1].upper() if found else None


def runnable(label: str | None) -> bool:
    """False for the types llamacy refuses (IQ*, TQ*, MXFP4, the retired Q4_0_4_4-style repacks)."""
    if label is None:
        return True
    return not (label.startswith(("IQ", "TQ", "MXFP4")) or re.fullmatch(r"Q4_0_\d_\d", label))


@dataclass(frozen=True)
class Variant:
    """One model in a repository: a single GGUF file, or the parts of a split one in order."""

    files: tuple[str, ...]
    size: int
    label: str | None

    @property
    def split(self) -> bool:
        return len(self.files) > 1

    @property
    def tag(self) -> str:
        """What goes after the colon in this variant's name."""
        return self.label or self.files[0].rsplit("/", 1)[-1]

    def describe(self) -> str:
        parts = f", {len(self.files)} parts" if self.split else ""
        return f"{self.tag} ({human_size(self.size)}{parts})"


def group_variants(files: Iterable[tuple[str, int]]) -> list[Variant]:
    """(path, size) pairs of a repository -> its model variants; split files grouped, complete sets only."""
    singles: list[Variant] = []
    parts: dict[str, dict[int, tuple[str, int]]] = {}
    counts: dict[str, int] = {}
    for path, size in files:
        base = path.rsplit("/", 1)[-1].lower()
        if not base.endswith(".gguf") or any(word in base for word in _NOT_MODELS):
            continue
        m = SPLIT_RE.search(path)
        if m is None:
            singles.append(Variant((path,), size, quant_label(path)))
            continue
        stem = path[: m.start()]
        parts.setdefault(stem, {})[int(m.group(1))] = (path, size)
        counts[stem] = int(m.group(2))
    for stem, found in parts.items():
        if sorted(found) != list(range(1, counts[stem] + 1)):
            continue  # a partial set of parts is no model
        ordered = [found[i] for i in sorted(found)]
        singles.append(
            Variant(tuple(p for p, _ in ordered), sum(s for _, s in ordered), quant_label(ordered[0][0]))
        )
    return sorted(singles, key=lambda v: (v.size, v.files))


def offers(variants: list[Variant]) -> str:
    return ", ".join(v.describe() for v in variants)


def _matches(variants: list[Variant], tag: str) -> list[Variant]:
    if tag.lower().endswith(".gguf"):
        return [v for v in variants if any(tag in (f, f.rsplit("/", 1)[-1]) for f in v.files)]
    exact = [v for v in variants if v.label == tag.upper()]
    if exact:
        return exact
    # Labels this module does not parse (UD-Q4_K_XL, ...): the tag as a whole word of the file name.
    word = re.compile(rf"(?<![A-Za-z0-9]){re.escape(tag)}(?![A-Za-z0-9_])", re.IGNORECASE)
    return [v for v in variants if word.search(SPLIT_RE.sub("", v.files[0]))]


def choose(variants: list[Variant], ref: HubRef, where: str) -> Variant:
    """The variant `ref` names among `variants` (found `where`: "on the hub", "in the cache")."""
    if not variants:
        raise UsageError(f"{ref.repo_id} has no GGUF model files {where}")
    if ref.tag is not None:
        found = _matches(variants, ref.tag)
        if not found:
            raise UsageError(f"{ref.repo_id} has no {ref.tag} file {where}; it offers: {offers(variants)}")
        if len(found) > 1:
            names = ", ".join(v.files[0] for v in found)
            raise UsageError(
                f"several {ref.repo_id} files carry {ref.tag}: {names}; name one as {ref.repo_id}:FILE"
            )
        return found[0]
    preferred = [v for v in variants if v.label == DEFAULT_QUANT]
    if preferred:
        return preferred[0]  # variants are sorted by size: the smallest of equals
    ok = [v for v in variants if runnable(v.label)]
    if not ok:
        raise UsageError(
            f"none of {ref.repo_id}'s files is a type llamacy runs; it offers: {offers(variants)}"
        )
    return ok[0]
