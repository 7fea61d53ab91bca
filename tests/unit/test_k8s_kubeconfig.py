"""Reading kubeconfigs: contexts, credentials, relative paths, and the refusals."""

from __future__ import annotations

import base64
import ssl

import pytest
import yaml

from mctl.errors import UsageError
from mctl.sched.k8s import kubeconfig


def write(tmp_path, users, server="https://10.0.0.1:6443", cluster_extra=None, current="a"):
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": current,
           "clusters": [{"name": "c", "cluster": {"server": server, **(cluster_extra or {})}}],
           "users": [{"name": "u", "user": users}],
           "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u"}},
                        {"name": "b", "context": {"cluster": "c", "user": "u"}}]}
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_token_and_relative_files(tmp_path):
    (tmp_path / "tok").write_text("abc\n")
    path = write(tmp_path, {"tokenFile": "tok", "client-certificate": "c.crt", "client-key": "c.key"},
                 cluster_extra={"certificate-authority": "ca.crt"})
    conn = kubeconfig.load(path)
    assert conn.token == "abc" and conn.context == "a" and conn.server == "https://10.0.0.1:6443"
    assert conn.ca_file == str(tmp_path / "ca.crt") and conn.cert_file == str(tmp_path / "c.crt")


def test_inline_data_and_context_choice(tmp_path):
    path = write(tmp_path, {"token": "t"}, cluster_extra={"certificate-authority-data": base64.b64encode(b"x").decode()})
    conn = kubeconfig.load(path, "b")
    assert conn.context == "b" and conn.ca_data == b"x"


def test_insecure_http_and_https(tmp_path):
    assert kubeconfig.load(write(tmp_path, {}, server="http://127.0.0.1:1")).ssl_context() is None
    ctx = kubeconfig.load(write(tmp_path, {}, cluster_extra={"insecure-skip-tls-verify": True})).ssl_context()
    assert ctx.verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize("users, message", [
    ({"exec": {"command": "aws"}}, "exec/auth-provider plugin"),
    ({"auth-provider": {"name": "oidc"}}, "exec/auth-provider plugin"),
])
def test_plugins_refused(tmp_path, users, message):
    with pytest.raises(UsageError, match=message):
        kubeconfig.load(write(tmp_path, users))


def test_missing_and_broken(tmp_path):
    with pytest.raises(UsageError, match="kubeconfig not found"):
        kubeconfig.load(tmp_path / "none")
    with pytest.raises(UsageError, match="no context named 'zz'"):
        kubeconfig.load(write(tmp_path, {}), "zz")
    with pytest.raises(UsageError, match="no usable server URL"):
        kubeconfig.load(write(tmp_path, {}, server="10.0.0.1"))
    (tmp_path / "list").write_text("- a\n")
    with pytest.raises(UsageError, match="is not a kubeconfig"):
        kubeconfig.load(tmp_path / "list")


def test_default_path_follows_kubeconfig_env(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/one:{tmp_path}/two")
    assert kubeconfig.default_path() == tmp_path / "one"


@pytest.mark.parametrize("cluster_extra, users, message", [
    ({"certificate-authority": "missing.crt"}, {}, "cannot use the cluster's certificate-authority"),
    ({"certificate-authority-data": base64.b64encode(b"not a certificate").decode()}, {},
     "cannot use the cluster's certificate-authority-data"),
    ({"certificate-authority-data": "!!not base64!!"}, {}, "certificate-authority-data is not base64"),
    ({}, {"tokenFile": "missing-token"}, "cannot read tokenFile"),
    ({}, {"client-certificate-data": base64.b64encode(b"x").decode(),
          "client-key-data": base64.b64encode(b"y").decode()}, "cannot use the user's client certificate"),
    ({"insecure-skip-tls-verify": "false"}, {}, "must be true or false"),
    ({"insecure-skip-tls-verify": True, "certificate-authority": "ca.crt"}, {}, "both a certificate authority"),
])
def test_bad_tls_material_is_a_usage_error_not_a_traceback(tmp_path, cluster_extra, users, message):
    with pytest.raises(UsageError, match=message):
        kubeconfig.load(write(tmp_path, users, cluster_extra=cluster_extra)).ssl_context()


def test_verification_stays_on_unless_insecure_is_true(tmp_path):
    conn = kubeconfig.load(write(tmp_path, {"token": "t"}, cluster_extra={"insecure-skip-tls-verify": False}))
    assert not conn.insecure
    ctx = conn.ssl_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_insecure_warns_once_on_stderr(tmp_path, capsys):
    from mctl.sched.k8s.client import KubeClient

    KubeClient(kubeconfig.load(write(tmp_path, {"token": "t"}, cluster_extra={"insecure-skip-tls-verify": True})))
    err = capsys.readouterr().err
    assert err.count("mctl: warning:") == 1 and "insecure-skip-tls-verify" in err and "not verified" in err
