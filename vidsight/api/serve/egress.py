"""What the server may connect to on a client's behalf (server-side request forgery).

Every outbound connection a client can cause (a completion's video fetch, a watch's or session's
network source, a webhook) names a host. The host is resolved once; if any address it resolves
to is loopback, private, link-local, unique-local, multicast, reserved or unspecified (IPv4,
IPv6 and IPv4-mapped IPv6 alike) the request is refused with 403 naming the rule, before anything
is sent. Otherwise the connection goes to the address that was checked, so a second lookup (DNS
rebinding) cannot send it elsewhere, and every redirect is checked again.

Opt-ins, per kind of connection: video fetches may be limited to named domains
(``--allowed-media-domains``, vLLM's flag and meaning; a named domain is the operator's own and
may resolve to any address), and stream sources and webhooks may reach named networks
(``--allowed-stream-networks 192.168.1.0/24``, ``--allowed-webhook-networks``), the common case being
cameras and receivers on a LAN.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import urllib.parse

from vidsight.errors import ConfigError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
DEFAULT_PORTS = {"http": 80, "https": 443, "rtsp": 554, "rtmp": 1935, "srt": 0, "udp": 0, "tcp": 0}


class EgressRefused(Exception):
    """A connection the rules refuse; the server answers 403 with this message."""


def address_class(address: Address) -> str | None:
    """The refused class ``address`` falls in (``"loopback"``, ...), or None for a public address."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for name, test in (("unspecified", lambda a: a.is_unspecified), ("loopback", lambda a: a.is_loopback),
                       ("link-local", lambda a: a.is_link_local), ("multicast", lambda a: a.is_multicast),
                       ("unique-local", lambda a: a.version == 6 and a in _UNIQUE_LOCAL),
                       ("reserved", lambda a: a.is_reserved), ("private", lambda a: a.is_private)):
        if test(address):
            return name
    return None if address.is_global else "reserved"   # shared (100.64/10), documentation, benchmarking...


def parse_networks(values, flag: str) -> tuple[Network, ...]:
    """``--allowed-...-networks`` values as networks (a bare address is a /32 or /128)."""
    try:
        return tuple(ipaddress.ip_network(value, strict=False) for value in values)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


@dataclasses.dataclass(frozen=True)
class EgressRules:
    """Where one kind of outbound connection may go.

    Attributes:
        kind: What connects, for messages (``"video fetch"``, ``"stream source"``, ``"webhook"``).
        networks: Networks allowed although their addresses are of a refused class.
        domains: Only these hosts (and their subdomains) may be reached, at any address; None:
            any host whose addresses are all public.
        flag: The option that opts in, named in refusals.
    """

    kind: str
    networks: tuple[Network, ...] = ()
    domains: tuple[str, ...] | None = None
    flag: str = ""

    def resolve(self, url: str) -> str:
        """The checked address to connect to for ``url``'s host (resolved once here).

        Raises:
            EgressRefused: the host is not allowed, or resolves to a refused address.
        """
        host, port = host_and_port(url)
        named = self._named(host)
        if self.domains is not None and not named:
            raise EgressRefused(f"{url}: {self.kind} to {host} refused: not in {self.flag}")
        try:
            infos = socket.getaddrinfo(host, port or None, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise EgressRefused(f"{url}: {self.kind} refused: {host} does not resolve ({exc})") from None
        addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))
        for address in addresses if not named else ():
            refused = address_class(address)
            if refused and not any(address in network for network in self.networks):
                via = "" if str(address) == host else f" ({host} resolves to {address})"
                hint = f"; allow it with {self.flag}" if self.flag else ""
                raise EgressRefused(f"{url}: {self.kind} to a {refused} address refused{via}{hint}")
        return str(addresses[0])

    def _named(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(host == d or host.endswith("." + d) for d in self.domains or ())


def host_and_port(url: str) -> tuple[str, int]:
    parsed = urllib.parse.urlsplit(url)
    if not parsed.hostname:
        raise EgressRefused(f"{url}: no host")
    try:
        port = parsed.port
    except ValueError:
        raise EgressRefused(f"{url}: the port is not a number") from None
    return parsed.hostname, port or DEFAULT_PORTS.get(parsed.scheme, 0)


def pinned(url: str, address: str) -> str:
    """``url`` with its host replaced by the checked ``address`` (credentials and port kept)."""
    parsed = urllib.parse.urlsplit(url)
    host = f"[{address}]" if ":" in address else address
    userinfo = parsed.netloc.rpartition("@")[0]
    netloc = (f"{userinfo}@" if userinfo else "") + host + (f":{parsed.port}" if parsed.port else "")
    return urllib.parse.urlunsplit(parsed._replace(netloc=netloc))


MAX_REDIRECTS = 5


async def send_checked(client, method: str, url: str, rules: EgressRules, **kwargs):
    """Send ``method url`` through ``client`` (an ``httpx.AsyncClient`` that does not follow
    redirects) to checked addresses only, following redirects, each checked again; returns the
    streamed final response (the caller closes it).

    Raises:
        EgressRefused: a host on the way is not allowed, or there are too many redirects.
    """
    import asyncio

    import httpx

    for _ in range(MAX_REDIRECTS + 1):
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise EgressRefused(f"{url}: {rules.kind} refused: only http and https are followed")
        address = await asyncio.to_thread(rules.resolve, url)
        target = httpx.URL(url)
        request = client.build_request(method, pinned(url, address), headers={"Host": target.netloc.decode()},
                                       extensions={"sni_hostname": target.host} if target.scheme == "https" else {},
                                       **kwargs)
        response = await client.send(request, stream=True)
        if not response.is_redirect:
            return response
        await response.aclose()
        url = urllib.parse.urljoin(url, response.headers.get("location", ""))
    raise EgressRefused(f"{url}: {rules.kind} refused: more than {MAX_REDIRECTS} redirects")
