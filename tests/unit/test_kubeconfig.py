"""functions.adapters.kubeconfig: the kubeconfig / in-cluster cases the functions meet, parsed
without the `kubernetes` package (which is only the fallback for exec / auth-provider users)."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from devstack.kubernetes.pki import loopback_certificate
from functions.adapters import kubeconfig
from functions.adapters.kubeconfig import FileToken, KubeConfig, KubeConfigError, from_kubeconfig, in_cluster

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, cluster: dict[str, Any], user: dict[str, Any], **extra: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx",
        "clusters": [{"name": "c", "cluster": cluster}, {"name": "other", "cluster": {"server": "http://x"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
        **extra,
    }
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_token(tmp_path: Path) -> None:
    config = from_kubeconfig(str(write(tmp_path / "kc", {"server": "https://k:6443/"}, {"token": "abc"})))
    assert config.server == "https://k:6443"
    assert config.authorization() == "Bearer abc"
    assert "abc" not in repr(config), "the token must not show up in reprs (logs)"
    assert not config.insecure and config.ca_file is None and config.cert_file is None


def test_token_file_relative_to_the_kubeconfig_and_reread(tmp_path: Path) -> None:
    (tmp_path / "conf" / "secrets").mkdir(parents=True)
    (tmp_path / "conf" / "secrets" / "token").write_text("one\n")
    config = from_kubeconfig(
        str(write(tmp_path / "conf" / "kc", {"server": "https://k"}, {"tokenFile": "secrets/token"}))
    )
    assert isinstance(config.credentials, FileToken)
    assert config.credentials.path == tmp_path / "conf" / "secrets" / "token"
    assert config.authorization() == "Bearer one"


def test_file_token_rotates_at_most_every_ttl(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("one")
    now = [100.0]
    token = FileToken(token_file, ttl=60.0, clock=lambda: now[0])
    assert token.authorization() == "Bearer one"
    token_file.write_text("two")
    now[0] += 59
    assert token.authorization() == "Bearer one"
    now[0] += 2
    assert token.authorization() == "Bearer two"
    token_file.unlink()
    now[0] += 61
    assert token.authorization() == "Bearer two", "a briefly missing file keeps the last token"


def test_client_certificate_data_and_ca_data(tmp_path: Path) -> None:
    cert = loopback_certificate()
    config = from_kubeconfig(
        str(
            write(
                tmp_path / "kc",
                {"server": "https://127.0.0.1:1", "certificate-authority-data": b64(cert.ca_pem)},
                {
                    "client-certificate-data": b64(cert.pem),
                    "client-key-data": b64(cert.key_file.read_bytes()),
                },
            )
        )
    )
    assert config.cert_data == cert.pem and config.key_data == cert.key_file.read_bytes()
    assert config.ca_data == cert.ca_pem.decode() and config.ca_file is None
    assert config.credentials is None
    context = config.ssl_context()  # loads the chain from private temporary files
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert len(context.get_ca_certs()) == 1


def test_client_certificate_and_ca_files_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    cert = loopback_certificate()
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_bytes(cert.ca_pem)
    (tmp_path / "pki" / "me.crt").write_bytes(cert.pem)
    (tmp_path / "pki" / "me.key").write_bytes(cert.key_file.read_bytes())
    config = from_kubeconfig(
        str(
            write(
                tmp_path / "kc",
                {"server": "https://127.0.0.1:1", "certificate-authority": "pki/ca.crt"},
                {"client-certificate": "pki/me.crt", "client-key": str(tmp_path / "pki" / "me.key")},
            )
        )
    )
    assert config.ca_file == str(tmp_path / "pki" / "ca.crt")
    assert config.cert_file == str(tmp_path / "pki" / "me.crt")
    assert config.key_file == str(tmp_path / "pki" / "me.key")
    assert len(config.ssl_context().get_ca_certs()) == 1


def test_insecure_skip_tls_verify(tmp_path: Path) -> None:
    config = from_kubeconfig(
        str(write(tmp_path / "kc", {"server": "https://k", "insecure-skip-tls-verify": True}, {"token": "t"}))
    )
    assert config.insecure
    context = config.ssl_context()
    assert context.verify_mode == ssl.CERT_NONE and not context.check_hostname


def test_missing_context_or_cluster_is_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path / "kc", {"server": "https://k"}, {"token": "t"}, **{"current-context": "nope"})
    with pytest.raises(KubeConfigError, match="nope"):
        from_kubeconfig(str(path))
    with pytest.raises(KubeConfigError, match="cannot read"):
        from_kubeconfig(str(tmp_path / "absent"))


def test_kubeconfig_list_first_file_wins(tmp_path: Path) -> None:
    first = write(tmp_path / "a", {"server": "https://first"}, {"token": "one"})
    second = write(tmp_path / "b", {"server": "https://second"}, {"token": "two"}, **{"current-context": "x"})
    config = from_kubeconfig(f"{first}:{second}")
    assert (config.server, config.authorization()) == ("https://first", "Bearer one")


JSON_ONLY = textwrap.dedent(
    """
    import sys
    from functions.adapters.kubeconfig import from_kubeconfig

    config = from_kubeconfig(sys.argv[1])
    assert config.server == "https://k" and config.authorization() == "Bearer t", config
    assert "yaml" not in sys.modules, "a JSON kubeconfig needs no YAML parser"
    """
)


def test_a_json_kubeconfig_is_read_without_the_yaml_parser(tmp_path: Path) -> None:
    path = write(tmp_path / "kc", {"server": "https://k"}, {"token": "t"})
    path.write_text(json.dumps(yaml.safe_load(path.read_text())), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", JSON_ONLY, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_yaml_flow_style_that_is_not_json_still_parses(tmp_path: Path) -> None:
    path = tmp_path / "kc"
    path.write_text(
        "{current-context: ctx, clusters: [{name: c, cluster: {server: 'https://flow'}}],"
        " users: [{name: u, user: {token: t}}], contexts: [{name: ctx, context: {cluster: c, user: u}}]}"
    )
    assert from_kubeconfig(str(path)).server == "https://flow"


def sa_dir(tmp_path: Path, token: str = "sa-token") -> Path:
    directory = tmp_path / "serviceaccount"
    directory.mkdir(exist_ok=True)
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_bytes(loopback_certificate().ca_pem)
    return directory


def test_in_cluster(tmp_path: Path) -> None:
    now = [0.0]
    directory = sa_dir(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    config = in_cluster(directory, env, clock=lambda: now[0])
    assert config.server == "https://10.0.0.1:443"
    assert config.ca_file == str(directory / "ca.crt")
    assert config.authorization() == "Bearer sa-token"
    (directory / "token").write_text("rotated")
    now[0] += 61
    assert config.authorization() == "Bearer rotated"
    assert len(config.ssl_context().get_ca_certs()) == 1


def test_in_cluster_ipv6_host_is_bracketed(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster(sa_dir(tmp_path), env).server == "https://[fd00::1]:6443"


def test_in_cluster_needs_env_and_files(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster(sa_dir(tmp_path), {})
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeConfigError, match="token"):
        in_cluster(tmp_path / "nowhere", env)


def test_load_without_kubeconfig_is_in_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.2")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert kubeconfig.load(None, sa_dir=sa_dir(tmp_path)).server == "https://10.0.0.2:443"


def test_exec_user_takes_the_kubernetes_package_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str | None]] = []

    def fake(path: str, context: str | None = None) -> KubeConfig:
        calls.append((path, context))
        return KubeConfig(server="https://from-the-package")

    monkeypatch.setattr(kubeconfig, "via_kubernetes_package", fake)
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws"}}
    path = write(tmp_path / "kc", {"server": "https://k"}, user)
    assert from_kubeconfig(str(path)).server == "https://from-the-package"
    assert calls == [(str(path), "ctx")]
    monkeypatch.undo()
    provider = {"auth-provider": {"name": "oidc", "config": {}}}
    monkeypatch.setattr(kubeconfig, "via_kubernetes_package", fake)
    from_kubeconfig(str(write(tmp_path / "kc2", {"server": "https://k"}, provider)))
    assert len(calls) == 2


def test_exec_user_through_the_real_kubernetes_loader(tmp_path: Path) -> None:
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"token": "from-exec"},
    }
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": ["-c", f"print({json.dumps(json.dumps(credential))})"],
            "interactiveMode": "Never",
        }
    }
    config = from_kubeconfig(str(write(tmp_path / "kc", {"server": "https://k:6443"}, user)))
    assert config.server == "https://k:6443"
    assert config.authorization() == "Bearer from-exec"


def test_the_control_planes_pki_is_a_ca_and_a_leaf_it_signed() -> None:
    cert = loopback_certificate()
    ca, leaf = x509.load_pem_x509_certificate(cert.ca_pem), x509.load_pem_x509_certificate(cert.pem)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert leaf.issuer == ca.subject != leaf.subject
    leaf.verify_directly_issued_by(ca)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert cert.key_file.stat().st_mode & 0o077 == 0


NO_KUBERNETES = textwrap.dedent(
    """
    import pkgutil, sys, importlib
    import functions
    for module in pkgutil.iter_modules(functions.__path__):
        importlib.import_module(f"functions.{module.name}")
    from functions.adapters.kube import Kube, connect
    from functions.resources.kinds import POD
    with open(sys.argv[1], "w") as out:
        out.write("apiVersion: v1\\nkind: Config\\ncurrent-context: c\\n"
                  "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\\n"
                  "users: [{name: u, user: {token: t}}]\\n"
                  "contexts: [{name: c, context: {cluster: c, user: u}}]\\n")
    kube = Kube(connect(sys.argv[1]))
    try:
        kube.get(POD, "default", "x")
    except Exception as err:  # nothing listens on port 9: KubeUnavailable
        assert type(err).__name__ == "KubeUnavailable", err
    heavy = sorted(m for m in sys.modules if m == "kubernetes" or m.startswith("kubernetes."))
    assert not heavy, heavy
    """
)


def test_functions_never_import_the_kubernetes_package(tmp_path: Path) -> None:
    """Every functions.<step> imported and a Kube built from a kubeconfig and used, in a fresh
    interpreter (other tests import `kubernetes` in this one)."""
    done = subprocess.run(
        [sys.executable, "-c", NO_KUBERNETES, str(tmp_path / "kc")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
