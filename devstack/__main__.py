"""`python -m devstack`: `serve [--endpoints-file PATH]` or `demo`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from devstack.stack import Stack

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ENDPOINTS = ROOT / ".devstack" / "endpoints.json"
KUBECONFIG = "kubeconfig"
"""Written beside the endpoints file: `kubectl --kubeconfig .devstack/kubeconfig get loraadapters -A`."""


def write_endpoints(stack: Stack, path: Path) -> None:
    """Atomically write the endpoints file (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(stack.endpoints(), indent=2) + "\n")
    os.replace(tmp, path)


def write_kubeconfig(stack: Stack, path: Path) -> None:
    """The admin's kubeconfig (kube-apiserver's URL, the stack's CA, a system:masters token),
    atomically, readable by its owner only (it holds a token)."""
    tmp = path.with_suffix(".tmp")
    stack.kube.write_kubeconfig(tmp, stack.kube.admin_token)
    tmp.chmod(0o600)
    os.replace(tmp, path)


def serve(endpoints_file: Path, ping_period: float | None) -> int:
    """Run the stack in the foreground until SIGINT/SIGTERM; the endpoints file exists meanwhile."""
    from devstack.demo import quiet_logs

    quiet_logs()
    stop = threading.Event()
    kubeconfig = endpoints_file.parent / KUBECONFIG

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Stack(ping_period=ping_period, filer_signing=True) as stack:
            write_kubeconfig(stack, kubeconfig)
            write_endpoints(stack, endpoints_file)
            print(f"loraflow devstack up; endpoints in {endpoints_file} (Ctrl-C to stop)", flush=True)
            print(f"  kubectl --kubeconfig {kubeconfig} get loraadapters -A", flush=True)
            while not stop.wait(1.0):
                write_endpoints(stack, endpoints_file)  # engines come and go, restarted processes too
            print("stopping ...", flush=True)
    finally:
        endpoints_file.unlink(missing_ok=True)
        kubeconfig.unlink(missing_ok=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="run the embedded stack in the foreground")
    serve_cmd.add_argument("--endpoints-file", type=Path, default=DEFAULT_ENDPOINTS)
    serve_cmd.add_argument("--ping-period", type=float, default=5.0, help="resync tick in seconds")
    commands.add_parser("demo", help="run the narrated adapter lifecycle on a fresh stack")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args.endpoints_file, args.ping_period)
    from devstack.demo import main as demo_main

    return demo_main()


if __name__ == "__main__":
    sys.exit(main())
