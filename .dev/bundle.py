"""Files for the GPU machine in chunks, over consecutive device calls (docs/experiments.md, "The runs on the GPU").

A device call carries at most 64 MiB of working tree, SmolLM2-135M-Instruct's GGUF alone is 94 MiB and cannot be
made smaller without loss (its 4-bit layer tensors are 63 MiB), and the machine keeps /tmp only while it stays
warm (30 s after a call). So the files go as one tar split into chunks, one chunk a call, the calls one right after
the other; the call that brings the last chunk checks the whole and unpacks it.

    python .dev/bundle.py pack OUT [NAME=]PATH... [--chunk-mib 40]   here: OUT/bundle-ID-KofN, N chunks
    python .dev/bundle.py add CHUNK... [--store /tmp/bundle]         there, in every call: keep the chunks
                                [--unpack DEST]                            the last call: check all, extract

ID is the start of the tar's sha256, so chunks of another bundle left on a warm machine are never mixed in.
`add --unpack` exits with status 4, saying which chunks are missing, when the machine is not the one that took the
earlier chunks (it went back, idle for more than 30 s): carry them again from the first.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

MIB = 1 << 20
CHUNK = re.compile(r"bundle-(?P<id>[0-9a-f]{16})-(?P<k>\d+)of(?P<n>\d+)$")
INCOMPLETE = 4


def pack(out: Path, inputs: list[str], chunk_bytes: int) -> list[Path]:
    """The inputs (files or folders, each under its own name or the NAME given as NAME=PATH) as one tar, split."""
    out.mkdir(parents=True, exist_ok=True)
    if any(CHUNK.match(p.name) for p in out.iterdir()):
        raise SystemExit(f"{out} already holds chunks: pack into an empty folder (`add OUT/*` takes them all)")
    with tempfile.TemporaryFile(dir=out) as raw:
        with tarfile.open(fileobj=raw, mode="w") as tar:
            for item in inputs:
                name, _, path = item.rpartition("=")
                tar.add(path, arcname=name or Path(path).name)
        raw.seek(0)
        digest = hashlib.sha256()
        while block := raw.read(MIB):
            digest.update(block)
        size = raw.tell()
        count = max(1, -(-size // chunk_bytes))
        bundle = digest.hexdigest()[:16]
        raw.seek(0)
        chunks = []
        for k in range(1, count + 1):
            chunks.append(out / f"bundle-{bundle}-{k}of{count}")
            chunks[-1].write_bytes(raw.read(chunk_bytes))
    return chunks


def add(chunks: list[Path], store: Path, unpack: Path | None) -> int:
    """Keep the chunks (all of one bundle) in `store`; with `unpack`, extract the bundle there once every chunk is
    in."""
    store.mkdir(parents=True, exist_ok=True)
    bundles = set()
    for chunk in chunks:
        match = CHUNK.match(chunk.name)
        if not match:
            raise SystemExit(f"{chunk}: not a chunk of `bundle.py pack` (bundle-ID-KofN)")
        bundles.add((match["id"], int(match["n"])))
    if len(bundles) != 1:
        raise SystemExit("the chunks given belong to different bundles: give the chunks of one")
    for chunk in chunks:
        shutil.copyfile(chunk, store / chunk.name)
    (bundle_id, count), = bundles
    have = {int(m["k"]) for p in store.iterdir()
            if (m := CHUNK.match(p.name)) and (m["id"], int(m["n"])) == (bundle_id, count)}
    missing = sorted(set(range(1, count + 1)) - have)
    print(f"bundle {bundle_id}: {count - len(missing)} of {count} chunks here", flush=True)
    if unpack is None:
        return 0
    if missing:
        print(f"missing chunk(s) {', '.join(map(str, missing))}: this machine did not take them (it was given back "
              "between calls); carry the chunks again from the first, one call right after the other",
              file=sys.stderr)
        return INCOMPLETE
    digest = hashlib.sha256()
    with tempfile.TemporaryFile(dir=store) as whole:
        for k in range(1, count + 1):
            data = (store / f"bundle-{bundle_id}-{k}of{count}").read_bytes()
            digest.update(data)
            whole.write(data)
        if digest.hexdigest()[:16] != bundle_id:
            raise SystemExit(f"bundle {bundle_id}: the chunks do not make up the bundle (sha256 "
                             f"{digest.hexdigest()[:16]}); pack it again")
        whole.seek(0)
        unpack.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=whole, mode="r") as tar:
            tar.extractall(unpack, filter="data")
    print(f"unpacked into {unpack}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="make the chunks (here)")
    packing.add_argument("out", type=Path)
    packing.add_argument("inputs", nargs="+", help="PATH or NAME=PATH, a file or a folder")
    packing.add_argument("--chunk-mib", type=float, default=40.0,
                         help="chunk size: 64 MiB less what else travels (the tree, 13.5 MiB in November 2026, and "
                              "the wheels with the first chunk)")
    adding = commands.add_parser("add", help="keep carried chunks; with --unpack, extract the whole (there)")
    adding.add_argument("chunks", nargs="+", type=Path)
    adding.add_argument("--store", type=Path, default=Path("/tmp/bundle"))
    adding.add_argument("--unpack", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command == "pack":
        for chunk in pack(args.out, args.inputs, int(args.chunk_mib * MIB)):
            print(f"{chunk} {chunk.stat().st_size / MIB:.1f} MiB")
        return 0
    return add(args.chunks, args.store, args.unpack)


if __name__ == "__main__":
    sys.exit(main())
