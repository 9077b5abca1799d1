"""The SeaweedFS filer stand-in over real HTTP (httpx): listing JSON, pagination, Md5, uploads,
downloads, moves, deletes and fault injection."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack.standins.filer import FilerServer

JSON = {"Accept": "application/json"}
D = "/loraadapters/ns/model/adapter"
ENTRY_KEYS = {
    "FullPath", "Mtime", "Crtime", "Ctime", "Atime", "Mode", "Uid", "Gid", "Mime", "TtlSec",
    "UserName", "GroupNames", "SymlinkTarget", "Md5", "FileSize", "Rdev", "Inode", "Extended",
    "HardLinkId", "HardLinkCounter", "Content", "Remote", "Quota", "WORMEnforcedAtTsNs",
}  # fmt: skip


@pytest.fixture
def filer(tmp_path: Path) -> Iterator[FilerServer]:
    t0 = time.monotonic()
    server = FilerServer(data_dir=tmp_path / "filer", host="127.0.0.1", port=0).start()
    assert time.monotonic() - t0 < 1.0
    yield server
    server.stop()


@pytest.fixture
def client(filer: FilerServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=filer.url, timeout=10) as c:
        yield c


def test_listing_json_shape(filer: FilerServer, client: httpx.Client) -> None:
    filer.put_file(f"{D}/adapter_config.json", b'{"r": 8}')
    filer.put_file(f"{D}/adapter_model.safetensors", b"weights")
    filer.put_file(f"{D}/sub/readme.md", b"hi")
    r = client.get(f"{D}/", headers=JSON)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {
        "Version", "Path", "Entries", "Limit", "LastFileName", "ShouldDisplayLoadMore",
        "EmptyFolder",
    }  # fmt: skip
    assert body["Path"] == D
    assert body["Limit"] == 100000
    assert body["LastFileName"] == "sub"
    assert body["ShouldDisplayLoadMore"] is False
    assert body["EmptyFolder"] is False
    names = [e["FullPath"] for e in body["Entries"]]
    assert names == [f"{D}/adapter_config.json", f"{D}/adapter_model.safetensors", f"{D}/sub"]
    cfg, _, sub = body["Entries"]
    assert set(cfg) == ENTRY_KEYS
    assert "chunks" not in cfg
    assert cfg["Mode"] == 0o660 == 432
    assert sub["Mode"] == 0x80000000 | 0o771 == 2147484153
    assert cfg["FileSize"] == 8 and sub["FileSize"] == 0
    assert sub["Md5"] is None
    assert cfg["Mtime"].endswith("Z") and "T" in cfg["Mtime"]
    # the directory without the trailing slash lists too
    assert client.get(D, headers=JSON).json()["Entries"] == body["Entries"]
    # files live on disk mirroring the path
    assert (filer.data_dir / D.lstrip("/") / "adapter_config.json").read_bytes() == b'{"r": 8}'


def test_md5_base64_is_hashlib_hex(filer: FilerServer, client: httpx.Client) -> None:
    data = b"x" * 100_000
    filer.put_file(f"{D}/w.bin", data)
    (entry,) = client.get(f"{D}/", headers=JSON).json()["Entries"]
    assert base64.b64decode(entry["Md5"]).hex() == hashlib.md5(data).hexdigest()
    meta = client.get(f"{D}/w.bin", params={"metadata": "true"}).json()
    assert meta["Md5"] == entry["Md5"] and meta["FileSize"] == 100_000


def test_empty_dir_root_and_missing(filer: FilerServer, client: httpx.Client) -> None:
    filer.mkdir("/empty")
    body = client.get("/empty/", headers=JSON).json()
    assert body["Entries"] is None
    assert body["EmptyFolder"] is True
    assert body["LastFileName"] == ""
    root = client.get("/", headers=JSON).json()
    assert root["Path"] == ""
    assert [e["FullPath"] for e in root["Entries"]] == ["/empty"]
    missing = client.get("/nope/", headers=JSON)
    assert missing.status_code == 404 and missing.content == b""
    assert client.get("/nope/file.bin").status_code == 404
    assert client.head("/nope").status_code == 404


@pytest.mark.parametrize("accept", ["*/*", "application/json, text/plain", "text/html", None])
def test_non_json_accept_gets_html(filer: FilerServer, client: httpx.Client, accept: str | None) -> None:
    filer.put_file(f"{D}/a.json", b"{}")
    headers = {"Accept": accept} if accept else {"Accept": ""}
    r = client.get(f"{D}/", headers=headers)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "<html>" in r.text and "a.json" in r.text


def test_pagination_2500_files_limit_1000(filer: FilerServer, client: httpx.Client) -> None:
    for i in range(2500):
        filer.put_file(f"/big/f{i:05d}.bin", b"%d" % i)
    seen: list[str] = []
    last = ""
    pages = 0
    while True:
        r = client.get("/big/", params={"limit": 1000, "lastFileName": last}, headers=JSON)
        body = r.json()
        pages += 1
        entries = body["Entries"] or []
        seen += [e["FullPath"].rsplit("/", 1)[1] for e in entries]
        assert body["Limit"] == 1000
        if not body["ShouldDisplayLoadMore"]:
            break
        assert len(entries) == 1000
        last = body["LastFileName"]
    assert pages == 3
    assert seen == [f"f{i:05d}.bin" for i in range(2500)]
    # exactly one full page at the end: the limit+1 probe says there is no more
    r = client.get("/big/", params={"limit": 500, "lastFileName": "f01999.bin"}, headers=JSON)
    assert r.json()["ShouldDisplayLoadMore"] is False
    assert len(r.json()["Entries"]) == 500


def test_listing_10000_is_fast(filer: FilerServer, client: httpx.Client) -> None:
    for i in range(10_000):
        filer.put_file(f"/huge/{i:05d}", b"")
    t0 = time.monotonic()
    last, total = "", 0
    while True:
        body = client.get("/huge/", params={"limit": 1000, "lastFileName": last}, headers=JSON).json()
        total += len(body["Entries"] or [])
        last = body["LastFileName"]
        if not body["ShouldDisplayLoadMore"]:
            break
    assert total == 10_000
    assert time.monotonic() - t0 < 3.0


def test_md5_missing_switch_and_append(filer: FilerServer, client: httpx.Client) -> None:
    filer.put_file(f"{D}/m.bin", b"abc")
    filer.set_md5_missing(f"{D}/m.bin", True)
    assert client.get(f"{D}/", headers=JSON).json()["Entries"][0]["Md5"] is None
    etag = client.head(f"{D}/m.bin").headers["etag"]
    assert etag.endswith('-1"') and hashlib.md5(b"abc").hexdigest() not in etag
    filer.set_md5_missing(f"{D}/m.bin", False)
    md5 = client.get(f"{D}/", headers=JSON).json()["Entries"][0]["Md5"]
    assert base64.b64decode(md5).hex() == hashlib.md5(b"abc").hexdigest()

    r = client.post(f"{D}/m.bin", params={"op": "append"}, content=b"def")
    assert r.status_code == 201
    meta = client.get(f"{D}/m.bin", params={"metadata": "true"}).json()
    assert meta["Md5"] is None and meta["FileSize"] == 6
    assert client.get(f"{D}/m.bin").content == b"abcdef"


def test_upload_put_reply_and_content_md5(client: httpx.Client) -> None:
    data = b"adapter bytes"
    digest = hashlib.md5(data).digest()
    r = client.put(f"{D}/x.bin", content=data)
    assert r.status_code == 201
    assert r.headers["Content-MD5"] == base64.b64encode(digest).decode()
    assert r.json() == {"name": "x.bin", "size": len(data)}
    # a correct Content-MD5, as base64 and as hex
    for value in (base64.b64encode(digest).decode(), digest.hex()):
        assert client.put(f"{D}/y.bin", content=data, headers={"Content-MD5": value}).status_code == 201
    bad = client.put(
        f"{D}/z.bin", content=data, headers={"Content-MD5": base64.b64encode(b"0" * 16).decode()}
    )
    assert bad.status_code == 400
    assert "BadDigest" in bad.json()["error"]
    assert client.get(f"{D}/z.bin").status_code == 404


def test_upload_multipart_and_chunked(client: httpx.Client) -> None:
    data = bytes(range(256)) * 4096 + b"\r\n--tail"  # 1 MiB with boundary-like bytes
    r = client.post(f"{D}/form.bin", files={"file": ("ignored.bin", data)}, data={"other": "field"})
    assert r.status_code == 201, r.text
    assert r.json() == {"name": "form.bin", "size": len(data)}
    assert client.get(f"{D}/form.bin").content == data
    # posting to a directory uses the part's filename
    r = client.post(f"{D}/", files={"file": ("named.json", b"{}", "application/json")})
    assert r.status_code == 201 and r.json()["name"] == "named.json"
    meta = client.get(f"{D}/named.json", params={"metadata": "true"}).json()
    assert meta["Mime"] == "application/json"

    def gen() -> Iterator[bytes]:
        for _ in range(8):
            yield b"z" * 100_000

    r = client.put(f"{D}/chunked.bin", content=gen())
    assert r.status_code == 201 and r.json()["size"] == 800_000
    assert r.headers["Content-MD5"] == base64.b64encode(hashlib.md5(b"z" * 800_000).digest()).decode()


def test_download_streaming_large(filer: FilerServer, client: httpx.Client) -> None:
    block = hashlib.sha256(b"seed").digest() * 32768  # 1 MiB
    expected = hashlib.md5()

    def gen() -> Iterator[bytes]:
        for _ in range(64):
            expected.update(block)
            yield block

    r = client.put("/large/model.bin", content=gen())
    assert r.status_code == 201
    head = client.head("/large/model.bin")
    assert head.headers["content-length"] == str(64 << 20)
    assert head.headers["etag"] == f'"{expected.hexdigest()}"'
    assert "last-modified" in head.headers
    got = hashlib.md5()
    with client.stream("GET", "/large/model.bin") as resp:
        assert resp.status_code == 200
        assert resp.headers["etag"] == f'"{expected.hexdigest()}"'
        for part in resp.iter_bytes():
            got.update(part)
    assert got.hexdigest() == expected.hexdigest()


def test_delete_and_move(filer: FilerServer, client: httpx.Client) -> None:
    filer.put_file(f"{D}/a.bin", b"a")
    filer.put_file(f"{D}/sub/b.bin", b"b")
    r = client.post("/moved/a2.bin", params={"mv.from": f"{D}/a.bin"})
    assert r.status_code == 204
    assert client.get("/moved/a2.bin").content == b"a"
    assert client.get(f"{D}/a.bin").status_code == 404
    assert not (filer.data_dir / D.lstrip("/") / "a.bin").exists()
    nonempty = client.delete(D)
    assert nonempty.status_code == 500 and "not empty" in nonempty.json()["error"]
    assert client.delete(D, params={"recursive": "true"}).status_code == 204
    assert client.get(f"{D}/", headers=JSON).status_code == 404
    assert client.delete("/never/existed").status_code == 204
    assert not (filer.data_dir / D.lstrip("/")).exists()


def test_faults_status_and_delay(filer: FilerServer, client: httpx.Client) -> None:
    filer.put_file("/f.txt", b"ok")
    filer.inject(status=503, times=2)
    assert [client.get("/f.txt").status_code for _ in range(3)] == [503, 503, 200]
    filer.inject(delay_s=0.3, times=1)
    t0 = time.monotonic()
    assert client.get("/f.txt").status_code == 200
    assert time.monotonic() - t0 >= 0.3
    t0 = time.monotonic()
    client.get("/f.txt")
    assert time.monotonic() - t0 < 0.3
    filer.inject(status=500, times=None)
    assert client.put("/g.txt", content=b"x").status_code == 500
    filer.clear_faults()
    assert client.put("/g.txt", content=b"x").status_code == 201
    assert filer.request_count == 7


def test_preexisting_disk_files_have_null_md5(tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    (data_dir / "pre" / "x").mkdir(parents=True)
    (data_dir / "pre" / "x" / "w.bin").write_bytes(b"12345")
    with FilerServer(data_dir=data_dir) as filer, httpx.Client(base_url=filer.url) as c:
        (entry,) = c.get("/pre/x/", headers=JSON).json()["Entries"]
        assert entry["FileSize"] == 5 and entry["Md5"] is None
        assert json.loads(c.get("/pre/", headers=JSON).content)["Entries"][0]["Mode"] == 2147484153
