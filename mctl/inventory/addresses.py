"""What a field that holds an address may hold: an IPv4 or IPv6 literal, or a host name, by the field's rules.

An address leaves mctl for ssh, Redfish, NMX-M and bind(), and each of those reads it with the C
library's resolver, which takes far more than an address: `127.1` is 127.0.0.1 to inet_aton,
`0127.0.0.1` is octal (87.0.0.1), `0x7f000001` is hex, `1.2.3.4.5` goes to DNS. Such a value looks
right in a review and points somewhere else, so the inventory refuses it (docs/inventory.md
"Addresses"):

  IPv4   four decimal numbers 0-255 without leading zeros (10.20.1.11)
  IPv6   RFC 4291 text (fd00::11, ::ffff:10.20.1.11), never in brackets; a zone (`fe80::1%eth0`)
         only where the field allows one (the SSH addresses: a link-local address needs its interface)
  name   an RFC 1123 host name (labels of letters, digits and '-', 63 characters each, 253 in all)
         whose last label is not a number (RFC 3696 section 2), where the field allows names

A URL writes an IPv6 address in brackets, without a zone (url_host_problem).
"""

from __future__ import annotations

import ipaddress
import re

from mctl.model.names import hidden_char, shown

ADDRESS_HINT = "an address is an IPv4 address (10.20.1.11), an IPv6 address (fd00::11) or a host name (head.example.com)"
IP_HINT = "an IPv4 address (10.20.1.11) or an IPv6 address (fd00::11), without brackets"

_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_ZONE = re.compile(r"^[A-Za-z0-9_.-]{1,15}\Z")          # an IPv6 zone: an interface name
# A label the resolver reads as a number: decimal, octal (leading 0) or hex (0x...).
_NUMBER = re.compile(r"^(?:0[xX][0-9A-Fa-f]*|[0-9]+)\Z")
_SPACE = re.compile(r"\s")


def address_problem(value: object, *, zone: bool = False, names: bool = True, host: bool = True) -> str | None:
    """Why *value* is not an address this field takes, or None.

    *zone*: an IPv6 zone (`%eth0`) is allowed; *names*: a host name is allowed, not only an IP literal;
    *host*: the address of one host to reach, so not the unspecified, a multicast or the broadcast address
    (which a listening address may be: 0.0.0.0 and :: bind every interface).
    """
    if not isinstance(value, str):
        return f"an address is a string, not {shown(value)}"
    if not value:
        return "an address must not be empty"
    if _SPACE.search(value) or hidden_char(value) is not None:
        return (f"{shown(value)} holds whitespace or a control character: an address is an IP address"
                + (" or a host name" if names else ""))
    if value.startswith("["):
        return f"{shown(value)}: an IPv6 address is written without brackets here (brackets belong in a URL)"
    if ":" in value:
        return _ipv6_problem(value, zone, host)
    if _NUMBER.match(value.rsplit(".", 1)[-1]):
        try:
            ip = ipaddress.IPv4Address(value)
        except ValueError:
            return (f"{shown(value)} is not an IPv4 address: four decimal numbers 0-255 without leading zeros "
                    "(a resolver reads 127.1 as 127.0.0.1, 010 as octal 8 and 0x7f as hex)")
        return _not_a_host(ip, value) if host else None
    if not names:
        return f"{shown(value)} is not an IP address"
    if not _HOSTNAME.match(value):
        return f"{shown(value)} is neither an IP address nor a host name"
    return None


_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


def _not_a_host(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, written: str) -> str | None:
    if ip.is_unspecified or ip.is_multicast or ip == _BROADCAST:
        kind = "the unspecified" if ip.is_unspecified else "a multicast" if ip.is_multicast else "the broadcast"
        return f"{shown(written)} is {kind} address, not the address of a host"
    return None


def _ipv6_problem(value: str, zone: bool, host: bool) -> str | None:
    text, sep, scope = value.partition("%")
    if sep and not zone:
        return f"{shown(value)}: an IPv6 address with a zone (%{scope}) is not allowed here"
    if sep and not _ZONE.match(scope):
        return f"{shown(value)}: the IPv6 address's zone {shown(scope)} is not an interface name"
    try:
        ip = ipaddress.IPv6Address(text)
    except ValueError:
        return f"{shown(value)} is not an IPv6 address"
    return _not_a_host(ip, value) if host else None


def url_host_problem(netloc: str) -> str | None:
    """Why the host of a URL's *netloc* (`[fd00::5]:8443`, `10.20.0.5`, `nmx.example.com`) is not one, or None."""
    host = netloc.rpartition("@")[2]
    if host.startswith("["):
        inner, closed, rest = host[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            return f"{shown(host)} is not a bracketed IPv6 address"
        if "%" in inner:
            return f"{shown(inner)}: an IPv6 address with a zone is not allowed in a URL"
        return _ipv6_problem(inner, False, True) if inner else "the URL has no host"
    name = host.rpartition(":")[0] if ":" in host else host
    if ":" in name:
        return f"{shown(host)}: an IPv6 address in a URL is written in brackets (https://[fd00::5])"
    if not name:
        return "the URL has no host"
    return address_problem(name)
