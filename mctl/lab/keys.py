"""SSH keys of a lab: one client key, and a host key per host made at `lab up`.

Host keys are generated here, not on first boot, so the lab's known_hosts is
complete before any connection: mctl verifies lab hosts exactly as it verifies
a real site's, with no trust-on-first-use.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KeyPair:
    private_openssh: bytes
    public_line: str          # "ssh-ed25519 AAAA... comment"


def ed25519(comment: str) -> KeyPair:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                             serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return KeyPair(priv, f"{pub.decode()} {comment}")


def known_hosts_line(names: list[str], key: KeyPair) -> str:
    """One known_hosts entry: every name the host is reached by, then its key (without comment)."""
    kind, blob = key.public_line.split()[:2]
    return f"{','.join(names)} {kind} {blob}"
