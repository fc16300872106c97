"""This machine's IPv4 LAN addresses, found without sending a packet off the box.

Gradio prints only ``0.0.0.0`` when listening on all interfaces, and
``gethostbyname(gethostname())`` often answers 127.0.0.1, so we ask the interfaces:
``ip -4 -o addr`` (Linux), ``ifconfig`` (macOS/BSD), then a UDP socket ``connect`` (which
only picks a route and source address; nothing is sent), then the host name.

Also which names a request may call this machine by (the Host/Origin guards of server.py and
the API's keyless access in api.py share them; here, so that neither imports the other).
"""
from __future__ import annotations

import ipaddress
import re
import shutil
import socket
import subprocess
from typing import Iterable, List
from urllib.parse import urlsplit

_INET = re.compile(r"\binet (?:addr:)?(\d{1,3}(?:\.\d{1,3}){3})")


def _usable(addr: str) -> bool:
    try:
        ip = ipaddress.IPv4Address(addr)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_unspecified or ip.is_multicast or ip.is_link_local)


def _from_command(argv: List[str]) -> List[str]:
    if shutil.which(argv[0]) is None:
        return []
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=3).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return _INET.findall(out)


def _from_udp_route() -> List[str]:
    # connect() on a UDP socket sends nothing; it only selects the outgoing address.
    found = []
    for probe in ("192.168.0.1", "10.0.0.1", "172.16.0.1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                found.append(s.getsockname()[0])
        except OSError:
            continue
    return found


def _from_hostname() -> List[str]:
    try:
        return [ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        return []


def _unique(addrs: Iterable[str]) -> List[str]:
    seen: List[str] = []
    for a in addrs:
        if _usable(a) and a not in seen:
            seen.append(a)
    return seen


def lan_addresses() -> List[str]:
    """Non-loopback IPv4 addresses of this machine, most specific source first."""
    addrs = _from_command(["ip", "-4", "-o", "addr", "show"]) or _from_command(["ifconfig"])
    return _unique(list(addrs) + _from_udp_route() + _from_hostname())


def lan_urls(port: int, scheme: str = "http") -> List[str]:
    return [f"{scheme}://{a}:{port}" for a in lan_addresses()]


def is_loopback(host: str) -> bool:
    """A name or address of this machine only (the API is open without a key only there)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_allowed(name: str, network: bool) -> bool:
    """May a request name this server `name` (the hostname of its Host or Origin)? On this
    machine only loopback names; shared on the network (--lan, --host) also an address
    literal and this machine's own names. A DNS name an attacker controls, pointed at one
    of our addresses (DNS rebinding), is none of these."""
    name = name.strip("[]").lower().rstrip(".")
    if is_loopback(name):
        return True
    if not network:
        return False
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        own = socket.gethostname().lower()
        return name in (own, own.split(".")[0], own.split(".")[0] + ".local")


def same_host(a: str, b: str) -> bool:
    return bool(a) and (a == b or (is_loopback(a) and is_loopback(b)))


def hostname_of(value: str) -> str:
    """The hostname of a Host header ("name:port") or an Origin ("scheme://name:port")."""
    try:
        return urlsplit(value if "//" in value else "//" + value).hostname or ""
    except ValueError:
        return ""
