""".dev/bundle.py: files split into chunks that travel one device call each, checked and unpacked by the
call that brings the last; a chunk missing (a fresh machine) is named, never silently skipped."""

from __future__ import annotations

import os

import pytest

from tests.scripts import load_script


def _bundle():
    return load_script(".dev/bundle.py")


def test_chunks_travel_one_call_each_and_unpack_whole(tmp_path, capsys):
    bundle = _bundle()
    (tmp_path / "model.gguf").write_bytes(os.urandom(5000))
    (tmp_path / "sft" / "final").mkdir(parents=True)
    (tmp_path / "sft" / "final" / "adapter_config.json").write_text('{"r": 16}')
    assert bundle.main(["pack", str(tmp_path / "chunks"), str(tmp_path / "model.gguf"),
                        f"sft={tmp_path / 'sft'}", "--chunk-mib", str(4096 / bundle.MIB)]) == 0
    chunks = sorted((tmp_path / "chunks").iterdir(), key=lambda p: int(bundle.CHUNK.match(p.name)["k"]))
    sizes = [p.stat().st_size for p in chunks]
    assert len(sizes) >= 3 and set(sizes[:-1]) == {4096} and 0 < sizes[-1] <= 4096  # 5000 bytes and the tar's own
    store, state = tmp_path / "store", tmp_path / "state"

    # a fresh machine in the middle: the last call finds chunks missing and says which
    assert bundle.main(["add", str(chunks[0]), "--store", str(store)]) == 0
    assert f"1 of {len(chunks)} chunks here" in capsys.readouterr().out
    assert bundle.main(["add", str(chunks[-1]), "--store", str(store), "--unpack", str(state)]) == bundle.INCOMPLETE
    missing = ", ".join(str(k) for k in range(2, len(chunks)))
    assert f"missing chunk(s) {missing}:" in capsys.readouterr().err and not state.exists()

    # another bundle's chunk on the same machine is left out; every chunk, then the whole checked and unpacked
    (store / f"bundle-0123456789abcdef-2of{len(chunks)}").write_bytes(b"stale")
    assert bundle.main(["add", *map(str, chunks[1:]), "--store", str(store), "--unpack", str(state)]) == 0
    assert (state / "model.gguf").read_bytes() == (tmp_path / "model.gguf").read_bytes()
    assert (state / "sft" / "final" / "adapter_config.json").read_text() == '{"r": 16}'

    # a chunk that changed on the way fails the check
    (store / chunks[1].name).write_bytes(b"x" * 4096)
    with pytest.raises(SystemExit, match="the chunks do not make up the bundle"):
        bundle.main(["add", str(chunks[-1]), "--store", str(store), "--unpack", str(tmp_path / "again")])


def test_chunks_of_different_bundles_are_refused(tmp_path):
    """`add` takes the chunks of one bundle (the same id and chunk count), and `pack` into a folder that already
    holds chunks is refused: repacking with another chunk size would otherwise leave two sets side by side."""
    bundle = _bundle()
    (tmp_path / "a.bin").write_bytes(os.urandom(3000))
    small, large = str(2048 / bundle.MIB), str(4096 / bundle.MIB)
    assert bundle.main(["pack", str(tmp_path / "one"), str(tmp_path / "a.bin"), "--chunk-mib", small]) == 0
    assert bundle.main(["pack", str(tmp_path / "two"), str(tmp_path / "a.bin"), "--chunk-mib", large]) == 0
    with pytest.raises(SystemExit, match="already holds chunks"):
        bundle.main(["pack", str(tmp_path / "one"), str(tmp_path / "a.bin"), "--chunk-mib", large])
    one, two = sorted((tmp_path / "one").iterdir()), sorted((tmp_path / "two").iterdir())
    with pytest.raises(SystemExit, match="different bundles"):
        bundle.main(["add", str(one[0]), str(two[-1]), "--store", str(tmp_path / "store")])
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir())
