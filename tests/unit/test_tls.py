"""functions.adapters.tls: a CA bundle is loaded only for https clients (cold start)."""

from __future__ import annotations

import ssl

from functions.adapters.tls import never_used, verify_for


def test_https_gets_httpx_default_verification() -> None:
    assert verify_for("https://k:6443") is True
    assert verify_for("HTTPS://filer") is True


def test_plain_http_gets_a_context_with_no_ca_bundle_loaded() -> None:
    context = verify_for("http://seaweedfs-filer.seaweedfs:8888")
    assert isinstance(context, ssl.SSLContext)
    assert context.cert_store_stats()["x509_ca"] == 0
    assert context is never_used(), "built once per process"
