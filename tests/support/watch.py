"""A long-running command's stdout, line by line, for as long as a block runs (`kubectl -w`)."""

from __future__ import annotations

import contextlib
import queue
import subprocess
import threading
from collections.abc import Iterator, Sequence


@contextlib.contextmanager
def lines_of(argv: Sequence[str]) -> Iterator[queue.Queue[str]]:
    """Start `argv`; yield its lines as they come; then stop it (SIGTERM, SIGKILL after 10 s)
    and close its pipe only once the reader has seen the pipe's end."""
    lines: queue.Queue[str] = queue.Queue()
    with subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as process:
        reader = threading.Thread(target=_pump, args=(process, lines), daemon=True)
        reader.start()
        try:
            yield lines
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
            reader.join(10)


def _pump(process: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line.rstrip("\n"))
