"""The filer listing decoder: only the fields stat reads, with the same values json.loads gives;
the filer's base64 `Md5` as hex.

FilerStorage decodes a page into FullPath/Mode/FileSize/Md5, and Mtime/Inode/chunk ids for a
file's version (and the page's cursor) without building the ~20 other fields of each entry;
whatever that typed decode refuses is decoded as it is, so what stat derives from a page never
depends on which decoder read it.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from functions.adapters.storage import _listing_page, entry_version, md5_from_base64

# One entry of the real SeaweedFS 4.48 (seaweedfs-real.md, "Exact samples"): chunks, an Inode
# past int64, RFC3339Nano times.
REAL_ENTRY = {
    "FullPath": "/loraadapters/default/llama3-8b/many/f00.bin",
    "Mtime": "2026-12-01T07:26:28.858481514Z",
    "Crtime": "2026-12-01T07:26:28Z",
    "Ctime": "0001-01-01T00:00:00Z",
    "Mode": 432,
    "Uid": 0,
    "GroupNames": None,
    "Md5": "ndTkYSaMgDT1yFZOFVxnpg==",
    "FileSize": 1,
    "Inode": 10615823439797541071,
    "Extended": None,
    "chunks": [
        {
            "file_id": "6,232dc7fcf61c",
            "size": 1,
            "modified_ts_ns": 1796125835030176551,
            "e_tag": "ndTkYSaMgDT1yFZOFVxnpg==",
            "fid": {"volume_id": 6, "file_key": 9005, "cookie": 3355244060},
        }
    ],
}


def read(page: Any) -> Any:
    """What FilerStorage takes from a decoded page, or the exception taking it raises."""
    try:
        if not isinstance(page, dict) or "Entries" not in page:
            return "not a directory"
        entries = [
            (
                str(e["FullPath"]),
                int(e.get("Mode") or 0),
                int(e.get("FileSize") or 0),
                e.get("Md5"),
                entry_version(e),
            )
            for e in page.get("Entries") or []
        ]
        return entries, page.get("LastFileName"), bool(page.get("ShouldDisplayLoadMore"))
    except Exception as err:
        return type(err).__name__


def test_a_real_page_keeps_only_what_stat_reads() -> None:
    raw = json.dumps({"Path": "/d", "Entries": [REAL_ENTRY], "LastFileName": "f00.bin"}).encode()
    page = _listing_page(raw)
    assert page == {
        "Entries": [
            {
                "FullPath": REAL_ENTRY["FullPath"],
                "Mode": 432,
                "FileSize": 1,
                "Md5": REAL_ENTRY["Md5"],
                "Mtime": REAL_ENTRY["Mtime"],
                "Inode": REAL_ENTRY["Inode"],
                "chunks": [{"file_id": "6,232dc7fcf61c", "size": 1}],
            }
        ],
        "LastFileName": "f00.bin",
    }


def test_what_is_not_a_listing_is_decoded_as_it_is() -> None:
    assert _listing_page(b"weights, not JSON") is None
    assert _listing_page(b"[1, 2]") == [1, 2]
    odd = {"Entries": [{"FullPath": 7, "Mode": 432.5}]}  # no filer writes this
    assert _listing_page(json.dumps(odd).encode()) == odd


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(["432", "0", " 7", "1e3", "0x10"]),
)
entries = st.dictionaries(
    st.sampled_from(["FullPath", "Mode", "FileSize", "Md5", "Inode", "Mtime", "chunks"]),
    st.one_of(scalars, st.lists(st.dictionaries(st.sampled_from(["file_id", "offset", "size"]), scalars))),
    max_size=7,
)
pages = st.dictionaries(
    st.sampled_from(["Entries", "LastFileName", "ShouldDisplayLoadMore", "Path"]),
    st.one_of(scalars, st.lists(entries, max_size=4)),
    max_size=4,
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a shared 2-core machine
@given(pages)
def test_stat_reads_the_same_from_either_decoder(page: dict[str, Any]) -> None:
    raw = json.dumps(page).encode()
    assert read(_listing_page(raw)) == read(json.loads(raw))


def test_the_filer_md5_is_read_as_hex_or_not_at_all() -> None:
    digest = bytes(range(16))
    assert md5_from_base64(base64.b64encode(digest).decode()) == digest.hex()
    for malformed in (None, "", "AAAA", "ndTkYSaMgDT1yFZOFVxnpg=", "nd TkYSaMgDT1yFZOFVxnpg==", "é=="):
        assert md5_from_base64(malformed) is None, malformed
    assert md5_from_base64(7) is None  # type: ignore[arg-type]  # a number where base64 belongs


@given(st.binary(min_size=16, max_size=16))
def test_every_digest_survives_the_filer_encoding(digest: bytes) -> None:
    assert md5_from_base64(base64.b64encode(digest).decode()) == digest.hex()


@given(st.text(max_size=40))
def test_any_text_gives_a_digest_or_none(value: str) -> None:
    found = md5_from_base64(value)
    assert found is None or (len(found) == 32 and int(found, 16) >= 0)
