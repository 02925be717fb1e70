"""A layer-skipping draft model: some blocks of a GGUF model (its first K, or a list), with its embeddings,
final norm and output head, written as a GGUF of its own.

    python3 benchmarks/make_draft.py MODEL.gguf K OUT.gguf          # blocks 0 .. K-1 (early exit)
    python3 benchmarks/make_draft.py MODEL.gguf 0-9,25-29 OUT.gguf  # these blocks, renumbered 0 ..

Self-speculation: the target's own layers guess its next tokens, read out through its final norm and head.
Truncation is early exit (LayerSkip, Elhoushi et al. 2024); keeping the last blocks as well and skipping
middle ones is Draft & Verify's layer skipping (Zhang et al. 2023): the last blocks are the ones that turn
the residual stream into next-token logits, which an untrained early exit lacks. The vocabulary is the target's by construction, so `--draft-model OUT.gguf` pairs with MODEL.
Without fine-tuning for early exit the guesses are worse than a real smaller model of the same family
would make; this file exists so that speculative decoding with a draft model can be measured on a machine
that holds no such pair.

Metadata is copied with each key's own value type; {arch}.block_count becomes the number kept and every
per-layer array under {arch}. (one value per block) keeps the kept blocks' values. The kept blocks' tensors,
renamed blk.0, blk.1, .. in order, and every tensor outside the blocks are copied byte for byte, types
unchanged. Uses the `gguf` package's reader and writer.

A block's position decides some of its hyper-parameters in some architectures (Gemma 3: every 6th block
attends globally with another RoPE base): for those, keep blocks whose new index has the old one's kind
(e.g. 0-5,12-17).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import gguf
from gguf import GGUFReader, GGUFValueType, GGUFWriter

_BLOCK = re.compile(r"blk\.(\d+)\.")


def _field_value(field: gguf.ReaderField) -> tuple[object, GGUFValueType, GGUFValueType | None]:
    vtype = GGUFValueType(field.types[0])
    sub = GGUFValueType(field.types[-1]) if vtype == GGUFValueType.ARRAY else None
    return field.contents(), vtype, sub


def parse_blocks(spec: str) -> list[int]:
    """ "K" (the first K blocks) or "A-B,C,.." (those blocks): ascending block indices."""
    try:
        if spec.isdigit():
            return list(range(int(spec)))
        blocks: list[int] = []
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            blocks.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(f"blocks must be K or a list like 0-9,25-29, got {spec!r}") from None
    if blocks != sorted(set(blocks)):
        raise ValueError(f"blocks must ascend without repeats, got {spec!r}")
    return blocks


def truncate(src: Path, blocks: list[int], dst: Path) -> tuple[int, int]:
    """Write the given blocks of src (ascending) to dst; returns (blocks in src, tensors written)."""
    reader = GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    count_key = f"{arch}.block_count"
    if count_key not in reader.fields:
        raise ValueError(f"{src.name}: no {count_key} in its metadata")
    n_layer = int(reader.fields[count_key].contents())
    if not blocks or blocks[-1] >= n_layer or len(blocks) == n_layer:
        raise ValueError(
            f"keep 1 to {n_layer - 1} of blocks 0-{n_layer - 1} ({src.name} has {n_layer}), not {blocks}"
        )
    n_keep = len(blocks)
    new_index = {old: new for new, old in enumerate(blocks)}
    what = f"first {n_keep}" if blocks == list(range(n_keep)) else f"{n_keep}"

    writer = GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    align = reader.fields.get("general.alignment")
    if align is not None:
        writer.data_alignment = int(align.contents())
    for name, field in reader.fields.items():
        # The writer writes general.architecture itself; GGUF.* are the reader's view of the header.
        if name == "general.architecture" or name.startswith("GGUF."):
            continue
        value, vtype, sub = _field_value(field)
        if name == count_key:
            value = n_keep
        elif name == "general.name":
            value = f"{value} ({what} of {n_layer} layers)"
        elif name.startswith(f"{arch}.") and vtype == GGUFValueType.ARRAY and len(value) == n_layer:
            value = [value[i] for i in blocks]  # one value per block (per-layer head counts, layer kinds)
        writer.add_key_value(name, value, vtype, sub_type=sub)

    kept = []
    for t in reader.tensors:
        m = _BLOCK.match(t.name)
        if m is None:
            kept.append((t.name, t))
        elif int(m.group(1)) in new_index:
            kept.append((f"blk.{new_index[int(m.group(1))]}.{t.name[m.end() :]}", t))
    for name, t in kept:
        # The reader's data of a quantized tensor is its bytes; raw_dtype makes the writer record the type.
        writer.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return n_layer, len(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="the target model (a GGUF file, or a name llamacy knows)")
    ap.add_argument("blocks", help="K (the first K blocks) or a list of blocks like 0-9,25-29")
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    src = args.model
    if not src.is_file():
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from llamacy.catalog import resolve_model
        from llamacy.errors import LlamacyError

        try:
            src = Path(resolve_model(str(args.model)))
        except LlamacyError as e:
            sys.exit(f"error: {e}")
    if args.out.resolve() == src.resolve():
        sys.exit("error: OUT must differ from MODEL")
    try:
        blocks = parse_blocks(args.blocks)
        n_layer, n_tensors = truncate(src, blocks, args.out)
    except (OSError, ValueError) as e:
        args.out.unlink(missing_ok=True)
        sys.exit(f"error: {e}")
    size = args.out.stat().st_size / 2**20
    print(f"{args.out}: blocks {args.blocks} of {n_layer}, {n_tensors} tensors, {size:.1f} MiB")


if __name__ == "__main__":
    main()
