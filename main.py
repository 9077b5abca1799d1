"""functions-framework source: every step, chosen at run time by FUNCTION_TARGET.

functions-framework --source main.py --target admit --signature-type http
"""

from functions.admit import admit
from functions.ingest import ingest
from functions.load import load
from functions.reload import reload
from functions.resync import resync
from functions.stat import stat
from functions.unload import unload
from functions.verify import verify

__all__ = ["admit", "ingest", "load", "reload", "resync", "stat", "unload", "verify"]
