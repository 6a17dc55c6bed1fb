"""Pack the policies of RL runs to re-bench them elsewhere: each run's selected policy (drkernel.train.selection),
a LoRA adapter of a few MB, copied into OUT/NAME/ with OUT/manifest.json: every file's size and sha256, the step
and validation score that chose it, the run's seed and commits (run_record.json), and the policy the adapter
adapts with its weights' digest (an SFT policy is rebuilt from its seed, not packed: docs/miniature.md).

    python -m drkernel.train.pack --out runs/mini/pack runs/mini/rl/recipemrs-s1 runs/mini/rl/recipemrs-s2 ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from drkernel.train.run_record import RUN_RECORD
from drkernel.train.selection import SelectionError, select_policy

MANIFEST = "manifest.json"
ADAPTER_CONFIG = "adapter_config.json"
SFT_SUMMARY = "sft_summary.json"


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _base(policy: Path) -> dict[str, Any]:
    """The policy an adapter adapts, with the digest its SFT run recorded (None where it recorded none)."""
    base = _read(policy / ADAPTER_CONFIG).get("base_model_name_or_path")
    digest = _read(Path(base).parent / SFT_SUMMARY).get("weights_sha256") if base else None
    return {"path": base, "weights_sha256": digest}


def pack_policies(runs: list[Path], out: Path) -> dict[str, Any]:
    """Copy each run's selected policy into OUT/<run folder's name>/ and write OUT/manifest.json; returns it."""
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"two runs share a folder name: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for run in runs:
        selection = select_policy(run)
        target = out / run.name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(selection.policy, target)
        files = {path.relative_to(target).as_posix(): {"bytes": path.stat().st_size, "sha256": file_digest(path)}
                 for path in sorted(target.rglob("*")) if path.is_file()}
        record = _read(run / RUN_RECORD)
        entries.append({
            "name": run.name, "run": str(run), "source": str(selection.policy), "step": selection.step,
            "validation_fast_1_2": selection.score, "validations": selection.validations,
            "seed": record.get("seed"), "commits": [start.get("commit") for start in record.get("starts", [])],
            "base": _base(selection.policy), "files": files, "bytes": sum(f["bytes"] for f in files.values()),
        })
    manifest = {"policies": entries, "bytes": sum(entry["bytes"] for entry in entries)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drkernel.train.pack", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="RL run folders (drkernel train's output_dir)")
    parser.add_argument("--out", type=Path, required=True, help="the folder to pack into")
    args = parser.parse_args(argv)
    try:
        manifest = pack_policies(args.runs, args.out)
    except (SelectionError, ValueError, OSError) as exc:
        parser.exit(2, f"error: {exc}\n")
    for entry in manifest["policies"]:
        print(f"{entry['name']}: step {entry['step']}, {entry['bytes'] / 1e6:.1f} MB")
    print(f"{len(manifest['policies'])} policies, {manifest['bytes'] / 1e6:.1f} MB in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
