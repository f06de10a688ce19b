#!/usr/bin/env python3
"""Zeroes the GPU code a shared library carries for architectures other than the ones kept.

A CUDA library's `.nv_fatbin` section holds, for each translation unit, one container (magic 0xBA55ED50) of
entries: SASS (ELF cubins) per SM architecture and, sometimes, PTX. ONNX Runtime's CUDA EP plugin carries SASS for
sm_75, 80, 86, 89, 90 and 120 (166 MB of its 230 MB), of which an H100/H200 loads only sm_90's. Zeroing the payloads
the device never selects leaves every header, offset and size as it was (the loader still parses the same
containers and picks the same entry) while the zeros compress to nothing: the plugin's xz stream shrinks from about
164 MB to 38 MB, which is what lets scripts/stage_ort_cuda.sh bring it to the lent GPU in two calls.

    scripts/fatbin_keep_arch.py IN.so OUT.so --keep 90        # rewrite
    scripts/fatbin_keep_arch.py IN.so --list                  # entries per (kind, arch) and their bytes

A container with no SASS entry for a kept architecture keeps its PTX entries whose architecture is at most the
highest kept one (the driver can JIT-compile those); everything else in it is zeroed.
"""
import argparse
import collections
import struct
import sys
from typing import Dict, Iterator, List, Tuple

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX = 1
KIND_SASS = 2


class FatbinError(ValueError):
    """The file is not a 64-bit little-endian ELF, or its .nv_fatbin section is not laid out as expected."""


class Entry:
    """One entry of a fatbin container: its kind (PTX or SASS), architecture, and where its payload lies."""

    def __init__(self, kind: int, arch: int, payload_offset: int, payload_size: int):
        self.kind, self.arch = kind, arch
        self.payload_offset, self.payload_size = payload_offset, payload_size


def fatbin_sections(data: bytes) -> List[Tuple[int, int]]:
    """(file offset, size) of every section named .nv_fatbin."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise FatbinError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        raise FatbinError("section header table lies outside the file")
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_offset = headers[shstrndx][4]
    found = []
    for name, _type, _flags, _addr, offset, size in headers:
        end = data.find(b"\0", names_offset + name)
        if data[names_offset + name:end] == b".nv_fatbin":
            if offset + size > len(data):
                raise FatbinError(".nv_fatbin lies outside the file")
            found.append((offset, size))
    return found


def containers(data: bytes, offset: int, size: int) -> Iterator[List[Entry]]:
    """The entries of each container in one .nv_fatbin section (containers are 8-byte aligned, zero-padded)."""
    pos, end = offset, offset + size
    while pos + 16 <= end:
        magic, _version, header_size, body_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8
            continue
        entry_pos, body_end = pos + header_size, pos + header_size + body_size
        if body_end > end:
            raise FatbinError(f"the container at {pos:#x} runs past its section")
        entries = []
        while entry_pos < body_end:
            kind, _unknown, entry_header, payload = struct.unpack_from("<HHIQ", data, entry_pos)
            arch, = struct.unpack_from("<I", data, entry_pos + 28)
            if entry_header < 32 or entry_pos + entry_header + payload > body_end:
                raise FatbinError(f"the entry at {entry_pos:#x} is malformed")
            entries.append(Entry(kind, arch, entry_pos + entry_header, payload))
            entry_pos += entry_header + payload
        yield entries
        pos = body_end


def entries_to_zero(entries: List[Entry], keep: List[int]) -> List[Entry]:
    """The entries of one container a device of a kept architecture never loads."""
    if any(e.kind == KIND_SASS and e.arch in keep for e in entries):
        return [e for e in entries if not (e.kind == KIND_SASS and e.arch in keep)]
    return [e for e in entries if not (e.kind == KIND_PTX and e.arch <= max(keep))]


def keep_arch(data: bytearray, keep: List[int]) -> Dict[str, int]:
    """Zeroes, in place, the payloads of the entries no kept architecture loads; returns bytes kept and zeroed."""
    totals = {"kept": 0, "zeroed": 0}
    for offset, size in fatbin_sections(data):
        for entries in containers(data, offset, size):
            drop = entries_to_zero(entries, keep)
            for e in drop:
                data[e.payload_offset:e.payload_offset + e.payload_size] = bytes(e.payload_size)
            totals["zeroed"] += sum(e.payload_size for e in drop)
            totals["kept"] += sum(e.payload_size for e in entries) - sum(e.payload_size for e in drop)
    return totals


def listing(data: bytes) -> Dict[Tuple[str, int], Tuple[int, int]]:
    """(kind, arch) -> (entries, payload bytes) over every container."""
    counts: Dict[Tuple[str, int], List[int]] = collections.defaultdict(lambda: [0, 0])
    for offset, size in fatbin_sections(data):
        for entries in containers(data, offset, size):
            for e in entries:
                key = ({KIND_PTX: "ptx", KIND_SASS: "sass"}.get(e.kind, f"kind{e.kind}"), e.arch)
                counts[key][0] += 1
                counts[key][1] += e.payload_size
    return {k: (v[0], v[1]) for k, v in counts.items()}


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("output", nargs="?")
    ap.add_argument("--keep", default="90", help="comma-separated SM architectures to keep (default 90)")
    ap.add_argument("--list", action="store_true", help="print the entries per kind and architecture")
    args = ap.parse_args(argv)
    try:
        data = bytearray(open(args.input, "rb").read())
        if args.list:
            for (kind, arch), (n, size) in sorted(listing(data).items()):
                print(f"{kind} sm_{arch}: {n} entries, {size / 1e6:.1f} MB")
            return 0
        if not args.output:
            ap.error("give OUT.so (or --list)")
        keep = [int(a) for a in args.keep.split(",")]
        totals = keep_arch(data, keep)
    except (OSError, FatbinError, ValueError) as error:
        print(f"fatbin_keep_arch.py: error: {error}", file=sys.stderr)
        return 1
    if totals["kept"] == 0:
        print(f"fatbin_keep_arch.py: error: {args.input} has no GPU code for sm_{args.keep}", file=sys.stderr)
        return 1
    with open(args.output, "wb") as out:
        out.write(data)
    print(f"kept {totals['kept'] / 1e6:.1f} MB of GPU code for sm_{args.keep}, zeroed {totals['zeroed'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
