"""known_hosts editing: exact entries, ports, hashed names, wildcards and markers."""

import base64
import hashlib
import hmac

from mctl.transport.known_hosts import HostKey, KnownHosts, fingerprint, host_patterns

K1 = HostKey("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIPgu9Bp/+FSm+/HJ79P7uy9tK2nxXdCAAFY1zRhcPBSQ")
K2 = HostKey("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIE2o1yVZFuVqSSJRRv1i5yvwBOXZ8u5jXT1Ir9n6e7kS")


def test_fingerprint_matches_openssh_form():
    # ssh-keygen -lf of K1 prints this SHA256 value
    digest = base64.b64encode(hashlib.sha256(base64.b64decode(K1.key_b64)).digest()).decode().rstrip("=")
    assert fingerprint(K1.key_type, K1.key_b64) == "SHA256:" + digest
    assert K1.describe().startswith("ssh-ed25519 SHA256:")


def test_patterns_follow_openssh_port_rules():
    assert host_patterns("tray01", "10.0.0.1", 22) == ["10.0.0.1", "tray01"]
    assert host_patterns("tray01", "10.0.0.1", 2222) == ["[10.0.0.1]:2222", "[tray01]:2222"]


def test_add_lookup_forget_roundtrip(tmp_path):
    kh = KnownHosts(tmp_path / "known_hosts", "# managed by hand\n*.mgmt ssh-ed25519 " + K2.key_b64 + "\n")
    kh.add("tray01", "10.0.0.1", 22, K1)
    assert kh.keys_for("tray01", "10.0.0.1", 22) == [K1]
    assert kh.keys_for("tray01", "10.0.0.1", 2222) == []
    assert kh.keys_for("x.mgmt", "10.9.9.9", 22) == [K2]           # wildcard entries are honoured
    kh.save()
    again = KnownHosts.load(tmp_path / "known_hosts")
    assert again.text().startswith("# managed by hand\n")
    assert again.forget("tray01", "10.0.0.1", 22) == 1
    assert again.keys_for("tray01", "10.0.0.1", 22) == []
    assert again.keys_for("x.mgmt", "10.9.9.9", 22) == [K2]          # never edits a wildcard line


def test_hashed_entries_match_and_can_be_forgotten(tmp_path):
    salt = b"0123456789abcdefghij"
    digest = base64.b64encode(hmac.new(salt, b"10.0.0.7", hashlib.sha1).digest()).decode()
    line = f"|1|{base64.b64encode(salt).decode()}|{digest} {K1.key_type} {K1.key_b64}\n"
    kh = KnownHosts(tmp_path / "kh", line)
    assert kh.keys_for("tray07", "10.0.0.7", 22) == [K1]
    assert kh.forget("tray07", "10.0.0.7", 22) == 1


def test_revoked_and_negated_entries(tmp_path):
    text = (f"@revoked 10.0.0.1 {K2.key_type} {K2.key_b64}\n"
            f"10.0.0.*,!10.0.0.2 {K1.key_type} {K1.key_b64}\n")
    kh = KnownHosts(tmp_path / "kh", text)
    assert kh.keys_for("a", "10.0.0.1", 22) == [K1]
    assert kh.revoked_for("a", "10.0.0.1", 22) == [K2]
    assert kh.keys_for("b", "10.0.0.2", 22) == []


def test_missing_file_is_empty_trust(tmp_path):
    kh = KnownHosts.load(tmp_path / "nope")
    assert kh.keys_for("a", "10.0.0.1", 22) == []
    assert kh.as_asyncssh().match("a", "10.0.0.1", 22)[0] == []
