"""Generate functions/proto's Python module from functions/proto/filer.proto.

The generated module is committed (functions/proto/filer_pb2.py and its .pyi): the functions'
image installs [project] dependencies with plain pip and must not need a protobuf compiler,
and a reviewer sees in a diff what a .proto change does to the code. `grpcio-tools` (pinned
in constraints.txt, the `dev` extra) brings the compiler; the same pinned version always
writes the same bytes, so tests/unit/test_filer_proto.py regenerates into a temporary
directory and requires the committed files to be identical.

    python -m tests.support.protogen     # rewrite functions/proto/filer_pb2.py(i)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "functions" / "proto"
PROTO = "filer.proto"
GENERATED = ("filer_pb2.py", "filer_pb2.pyi")


def generate(out_dir: Path) -> list[Path]:
    """Run the pinned protoc on filer.proto into `out_dir`; returns the files written."""
    from grpc_tools import protoc  # dev extra only: the image never generates code

    out_dir.mkdir(parents=True, exist_ok=True)
    argv = ["protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}", f"--pyi_out={out_dir}", PROTO]
    code = protoc.main(argv)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code} on {PROTO_DIR / PROTO}")
    return [out_dir / name for name in GENERATED]


def main() -> int:
    for path in generate(PROTO_DIR):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
