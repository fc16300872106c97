"""This machine's IPv4 LAN addresses, found without sending a packet off the box.

Gradio prints only ``0.0.0.0`` when listening on all interfaces, and
``gethostbyname(gethostname())`` often answers 127.0.0.1, so we ask the interfaces:
``ip -4 -o addr`` (Linux), ``ifconfig`` (macOS/BSD), then a UDP socket ``connect`` (which
only picks a route and source address; nothing is sent), then the host name.
"""
from __future__ import annotations

import ipaddress
import re
import shutil
import socket
import subprocess
from typing import Iterable, List

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
