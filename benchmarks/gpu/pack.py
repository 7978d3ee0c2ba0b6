"""benchmarks/gpu/run.sh's last step: what a GPU run wrote, packed into the few files the lent
machine returns (at most 8 files of 16 MiB each, 2 folders deep: the device tool's README).

    python benchmarks/gpu/pack.py WORK OUT [--mode gpu|rehearse]

OUT gets summary.md (the stages with their exit status and time, what did not import,
gpu_check's claim table, pytest's last lines, what the tarball left out), gpu_check.json
(gpu_check's summary.json, with every figure), pytest.txt and gpu_run.tar.gz (all of WORK but
files over 2 MiB; if it still passes 15 MiB, files over 256 KiB are left out too); run.sh
adds console.log. Imports nothing but the standard library: it must pack even when torch or
memtop's imports are what broke.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import time
from pathlib import Path

MIB = 1 << 20
MAX_FILES = 8
TAR_NAME = "gpu_run.tar.gz"
TAR_LIMIT = 15 * MIB  # the device returns files of 16 MiB at most
FILE_LIMITS = (2 * MIB, 256 * 1024)  # per file in the tarball: first try, second try
PYTEST_TAIL = 40


def read_stages(work: Path) -> list[tuple[str, str, str]]:
    """(stage, exit status, seconds) as gpu_run.sh recorded them."""
    path = work / "stages.tsv"
    if not path.is_file():
        return []
    return [tuple((line.split("\t") + ["", ""])[:3])  # type: ignore[misc]
            for line in path.read_text().splitlines() if line.strip()]


def pack(work: Path, tar_path: Path) -> list[str]:
    """WORK into a gzipped tarball under TAR_LIMIT; returns what was left out and why."""
    files = sorted(p for p in work.rglob("*") if p.is_file() and not p.is_symlink())
    for limit in FILE_LIMITS:
        left = [f"{p.relative_to(work)} ({p.stat().st_size / MIB:.1f} MiB)" for p in files
                if p.stat().st_size > limit]
        with tarfile.open(tar_path, "w:gz") as tar:
            for p in files:
                if p.stat().st_size <= limit:
                    tar.add(p, arcname=str(p.relative_to(work)))
        if tar_path.stat().st_size <= TAR_LIMIT:
            return left
    return left + [f"the tarball is {tar_path.stat().st_size / MIB:.1f} MiB even so"]


def summary(work: Path, mode: str, left_out: list[str]) -> str:
    stages = read_stages(work)
    packed = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    lines = [f"# memtop GPU run ({mode}, packed {packed})", "",
             "| stage | exit | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {rc} | {secs} |" for name, rc, secs in stages]
    imports = work / "imports.txt"
    if imports.is_file():
        missing = [ln for ln in imports.read_text().splitlines() if "MISSING" in ln]
        lines += ["", "Imports: " + ("all present" if not missing else "; ".join(missing))]
    check = work / "gpu_check" / "summary.md"
    lines += ["", "## gpu_check", ""]
    if check.is_file():
        body = check.read_text().splitlines()
        lines += body[2:] if body and body[0].startswith("# ") else body
    else:
        lines.append("gpu_check wrote no summary.md (see console.log)")
    pytest_out = work / "pytest.txt"
    lines += ["", "## pytest (last lines)", "", "```"]
    if pytest_out.is_file():
        lines += pytest_out.read_text(errors="replace").splitlines()[-PYTEST_TAIL:]
    else:
        lines.append("pytest did not run")
    lines += ["```", "", "## Left out of the tarball", ""]
    lines += [f"- {x}" for x in left_out] or ["nothing"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--mode", default="gpu")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    left = pack(args.work, args.out / TAR_NAME)
    (args.out / "summary.md").write_text(summary(args.work, args.mode, left), encoding="utf-8")
    for src, name in ((args.work / "gpu_check" / "summary.json", "gpu_check.json"),
                      (args.work / "pytest.txt", "pytest.txt")):
        if src.is_file():
            shutil.copyfile(src, args.out / name)
    written = sorted(p.name for p in args.out.iterdir())
    print(f"gpu_pack: {', '.join(written)} (+ console.log); left out: {len(left)}")
    if len(written) + 1 > MAX_FILES:
        print(f"gpu_pack: {len(written) + 1} files: over the {MAX_FILES} the machine returns",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
