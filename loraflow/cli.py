"""The `loraflow` command: upload an adapter, see where adapters are loaded, tail events.

Exit codes: 0 ok; 1 an expected failure (one clear line on stderr, no traceback); 2 usage;
130 interrupted.

Only the standard library is imported here: each command imports what it uses when it runs,
so `loraflow --help` answers in a few tens of milliseconds (the kubernetes package alone takes
~0.3 s to import), and where the `cli` extra is not installed a command says so in one line.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from loraflow.errors import CliError, missing_extra

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from loraflow.connect import Target
    from loraflow.upload import UploadReport


def _console(stderr: bool = False) -> Console:
    """Rich console; wide when not a terminal so piped tables are not squeezed to 80 columns."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    probe = Console(file=stream)
    return Console(file=stream, width=None if probe.is_terminal else 200, stderr=stderr)


# -- parser ----------------------------------------------------------------------------------
def _connection_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection")
    group.add_argument(
        "--endpoints",
        metavar="FILE",
        help="embedded stack endpoints (default: .devstack/endpoints.json when present)",
    )
    group.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: standard loading)")
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loraflow", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _connection_options()

    up = commands.add_parser("upload", parents=[common], help="upload an adapter directory and declare it")
    up.add_argument("directory", metavar="DIR", type=Path, help="local adapter directory")
    up.add_argument("--model", required=True, help="spec.model: the Model the adapter was tuned from")
    up.add_argument("--name", required=True, help="LoRAAdapter name (also the vLLM lora_name)")
    up.add_argument("--namespace", "-n", help="namespace (default: kubeconfig context, else default)")
    up.add_argument("--filer-url", help="SeaweedFS filer URL (default: endpoints file, $LORAFLOW_FILER_URL)")
    up.add_argument(
        "--filer-token-file",
        metavar="FILE",
        type=Path,
        help="file holding the filer write token (default: $LORAFLOW_FILER_TOKEN, the endpoints file)",
    )
    up.set_defaults(run=_upload)

    st = commands.add_parser(
        "status", parents=[common], help="adapters, their state and where they are loaded"
    )
    st.add_argument("name", nargs="?", metavar="NAME", help="only adapters with this name")
    scope = st.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", help="namespace (default: kubeconfig context, else default)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="every namespace")
    st.add_argument("--watch", "-w", action="store_true", help="refresh until Ctrl-C")
    st.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (--watch)")
    st.set_defaults(run=_status)

    ev = commands.add_parser("events", parents=[common], help="tail domain events from the embedded broker")
    ev.add_argument("--follow", "-f", action="store_true", help="keep polling until Ctrl-C")
    ev.add_argument("--type", dest="prefix", help="type prefix (default: io.loraflow.)")
    ev.add_argument("--all", action="store_true", help="every event type, sources' included")
    ev.add_argument("--deliveries", action="store_true", help="also show successful deliveries")
    ev.add_argument("--broker-url", help="broker URL (default: from the endpoints file)")
    ev.add_argument("--interval", type=float, default=1.0, help="seconds between polls (--follow)")
    ev.set_defaults(run=_events)
    return parser


# -- commands --------------------------------------------------------------------------------
def _namespace(args: argparse.Namespace, target: Target) -> str:
    from loraflow.connect import default_namespace

    return str(args.namespace) if args.namespace else default_namespace(target)


def _upload(args: argparse.Namespace) -> int:
    from loraflow.connect import filer_token, kube_client, resolve
    from loraflow.upload import upload

    target = resolve(args.endpoints, args.kubeconfig, filer_url=args.filer_url)
    namespace = _namespace(args, target)
    token = filer_token(target, namespace, args.filer_token_file)
    out = _console()
    report = upload(
        args.directory,
        namespace,
        args.model,
        args.name,
        target.filer_url,
        lambda: kube_client(target),
        _console(stderr=True),
        target.filer_root,
        token,
    )
    _print_upload(out, report, namespace, args.name, args.model)
    return 0


def _print_upload(out: Console, report: UploadReport, namespace: str, name: str, model: str) -> None:
    from loraflow.upload import SKIPPED

    for outcome in report.outcomes:
        style = "dim" if outcome.result == SKIPPED else "green"
        out.print(f"[{style}]{outcome.result:<20}[/] {outcome.storage_path}  ({outcome.file.size} B)")
    total = sum(o.file.size for o in report.uploaded)
    out.print(
        f"{len(report.uploaded)} uploaded ({total} B), {len(report.skipped)} skipped (unchanged) "
        f"to {report.directory}"
    )
    out.print(f"LoRAAdapter {namespace}/{name} {report.adapter} with {len(report.outcomes)} MD5s")
    if not report.model_exists:
        out.print(
            f"[yellow]No Model {model!r} in namespace {namespace!r}[/]: the adapter waits for it. "
            f"Create the Model, and a ModelDeployment whose spec.loraAdapters lists {name!r} to serve it "
            "(`kubectl apply -k examples/` makes both for the example in namespace team-a)."
        )


def _status(args: argparse.Namespace) -> int:
    from loraflow import render, status
    from loraflow.connect import kube_client, resolve

    target = resolve(args.endpoints, args.kubeconfig)
    namespace = None if args.all_namespaces else _namespace(args, target)
    api = kube_client(target)

    def view() -> RenderableType:
        rows = status.collect(api, namespace, args.name)
        if args.name and not rows and not args.watch:
            where = "any namespace" if namespace is None else f"namespace {namespace}"
            raise CliError(f"no LoRAAdapter named {args.name} in {where}")
        return render.status_view(rows, namespace is None)

    out = _console()
    if not args.watch:
        out.print(view())
        return 0
    return _watch(out, view, args.interval)


def _pause(seconds: float) -> None:
    """Between refreshes (a seam for tests)."""
    time.sleep(seconds)


def _watch(out: Console, view: Callable[[], RenderableType], interval: float) -> int:
    from rich.live import Live

    with Live(view(), console=out, auto_refresh=False, screen=False) as live:
        while True:
            _pause(interval)
            live.update(view(), refresh=True)


def _events(args: argparse.Namespace) -> int:
    from loraflow import tail
    from loraflow.connect import resolve

    target = resolve(args.endpoints, args.kubeconfig, broker_url=args.broker_url)
    if not target.broker_url:
        raise CliError("no broker URL: pass --broker-url or --endpoints (the embedded stack's file)")
    prefix = "" if args.all else (tail.OURS if args.prefix is None else args.prefix)
    tail.tail(
        target.broker_url,
        _console(),
        prefix,
        follow=args.follow,
        deliveries=args.deliveries,
        interval=args.interval,
    )
    return 0


def _error(err: CliError) -> None:
    """One line on stderr: red through rich when it is installed, plain text otherwise."""
    try:
        from rich.markup import escape

        # escaped: a message may hold brackets (`loraflow[cli]`) that are not markup
        _console(stderr=True).print(f"[bold red]error:[/] {escape(str(err))}", highlight=False)
    except ModuleNotFoundError:
        print(f"error: {err}", file=sys.stderr)


# -- entry point -----------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except ModuleNotFoundError as err:
        extra = missing_extra(err)
        if extra is None:
            raise
        _error(extra)
        return 1
    except CliError as err:
        _error(err)
        return 1
    except KeyboardInterrupt:
        return 130 if not getattr(args, "watch", False) and not getattr(args, "follow", False) else 0
    return code


if __name__ == "__main__":
    sys.exit(main())
