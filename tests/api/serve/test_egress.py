"""Outbound connections a client can cause: refused to non-public addresses by default (resolved
once, redirects checked again), the opt-ins, and FFmpeg kept to a source's own protocols."""

import http.server
import ipaddress
import socket

import httpx
import pytest

from vidsight.api.serve.egress import EgressRefused, EgressRules, address_class, pinned

from tests.api.serve.test_security import body, send_file, serving

pytestmark = pytest.mark.slow

REFUSED = {"127.0.0.1": "loopback", "::1": "loopback", "::ffff:127.0.0.1": "loopback", "10.1.2.3": "private",
           "172.16.0.9": "private", "192.168.1.20": "private", "::ffff:192.168.1.20": "private",
           "169.254.169.254": "link-local", "fe80::1": "link-local", "fd00::1": "unique-local",
           "224.0.0.1": "multicast", "ff02::1": "multicast", "0.0.0.0": "unspecified", "::": "unspecified",
           "240.0.0.1": "reserved", "100.64.0.1": "reserved"}


@pytest.mark.parametrize("address,refused", sorted(REFUSED.items()))
def test_every_non_public_address_class_is_named(address, refused):
    assert address_class(ipaddress.ip_address(address)) == refused
    with pytest.raises(EgressRefused, match=f"a {refused} address refused"):
        EgressRules("stream source", flag="--allowed-stream-networks").resolve(f"rtsp://[{address}]:554/x"
                                                                               if ":" in address else
                                                                               f"rtsp://{address}/x")


@pytest.mark.parametrize("address", ["8.8.8.8", "2001:4860:4860::8888", "::ffff:8.8.8.8"])
def test_public_addresses_pass_and_the_url_is_pinned_to_the_checked_one(address):
    assert address_class(ipaddress.ip_address(address)) is None
    host = f"[{address}]" if ":" in address else address
    checked = EgressRules("stream source").resolve(f"rtsp://user:pw@{host}:8554/cam")
    assert ipaddress.ip_address(checked) == ipaddress.ip_address(address)


def test_a_name_is_resolved_once_and_every_address_it_gives_must_pass(monkeypatch):
    answers = {"camera.example": ["93.184.216.34", "127.0.0.1"], "public.example": ["93.184.216.34"]}
    lookups = []

    def getaddrinfo(host, port, *args, **kwargs):
        lookups.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port or 0)) for a in answers[host]]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    rules = EgressRules("stream source", flag="--allowed-stream-networks")
    with pytest.raises(EgressRefused, match=r"loopback address refused \(camera.example resolves to 127.0.0.1\)"):
        rules.resolve("rtsp://camera.example/live")
    address = rules.resolve("rtsp://public.example:8554/live")
    assert lookups == ["camera.example", "public.example"]
    assert pinned("rtsp://u:p@public.example:8554/live?x=1", address) == "rtsp://u:p@93.184.216.34:8554/live?x=1"
    assert pinned("rtsp://public.example/live", "2001:db8::1") == "rtsp://[2001:db8::1]/live"


def test_the_opt_ins_allow_what_they_name_and_nothing_else():
    lan = EgressRules("stream source", (ipaddress.ip_network("192.168.1.0/24"),), flag="--allowed-stream-networks")
    assert lan.resolve("rtsp://192.168.1.20/cam") == "192.168.1.20"
    with pytest.raises(EgressRefused, match="--allowed-stream-networks"):
        lan.resolve("rtsp://192.168.2.20/cam")
    media = EgressRules("video fetch", domains=("localhost", "media.example"), flag="--allowed-media-domains")
    assert media.resolve("http://localhost:8080/v.mp4") in ("127.0.0.1", "::1")   # named: any address
    with pytest.raises(EgressRefused, match="not in --allowed-media-domains"):
        media.resolve("http://127.0.0.1/v.mp4")
    with pytest.raises(EgressRefused, match="not in --allowed-media-domains"):
        media.resolve("http://notmedia.example/v.mp4")


@pytest.fixture
def counting_http(media):
    """A local HTTP server that counts requests: /clip.mp4 serves, /to/URL redirects to URL."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Host")))
            if self.path.startswith("/to/"):
                self.send_response(302)
                self.send_header("Location", self.path[len("/to/"):])
                self.end_headers()
                return
            send_file(self, media / "clip.mp4")

        def log_message(self, *args):
            pass

    with serving(Handler) as port:
        yield port, seen


def test_completion_fetches_of_loopback_hosts_are_refused_without_contacting_them(make_local_server,
                                                                                  counting_http, scratch):
    port, seen = counting_http
    with make_local_server() as (url, _):
        for source in (f"http://127.0.0.1:{port}/clip.mp4", f"http://localhost:{port}/clip.mp4",
                       f"http://[::ffff:127.0.0.1]:{port}/clip.mp4"):
            answer = httpx.post(f"{url}/v1/chat/completions", json=body(source), timeout=60)
            assert answer.status_code == 403, source
            assert "loopback address refused" in answer.json()["error"]["message"]
    assert seen == []


def test_an_allowed_media_domain_is_fetched_at_the_checked_address_and_redirects_are_checked_again(
        make_local_server, counting_http, scratch):
    port, seen = counting_http
    with make_local_server(allowed_media_domains=("localhost",)) as (url, _):
        answer = httpx.post(f"{url}/v1/chat/completions", json=body(f"http://localhost:{port}/clip.mp4"), timeout=120)
        assert answer.status_code == 200
        assert seen == [("/clip.mp4", f"localhost:{port}")]   # the name travels as Host, the address was checked
        away = f"http://localhost:{port}/to/http://127.0.0.1:{port}/clip.mp4"
        answer = httpx.post(f"{url}/v1/chat/completions", json=body(away), timeout=60)
        assert answer.status_code == 403 and "not in --allowed-media-domains" in answer.json()["error"]["message"]
        assert [path for path, _ in seen] == ["/clip.mp4", f"/to/http://127.0.0.1:{port}/clip.mp4"]


def test_watch_sources_and_webhooks_to_private_hosts_are_refused_unless_their_network_is_allowed(make_local_server):
    spec = {"query": "Is it red?", "window_s": 2.0, "stride": 0.5, "fps": 2.0}
    with make_local_server() as (url, _):
        for source in ("rtsp://127.0.0.1:8554/cam", "http://169.254.169.254/latest/meta-data", "srt://[::1]:9000"):
            answer = httpx.post(f"{url}/v1/watches", json={**spec, "source": source})
            assert answer.status_code == 403 and "address refused" in answer.json()["error"]["message"], source
        answer = httpx.post(f"{url}/v1/sessions", json={"source": "rtsp://10.0.0.7/cam", "fps": 2.0})
        assert answer.status_code == 403 and "--allowed-stream-networks" in answer.json()["error"]["message"]
        hook = httpx.post(f"{url}/v1/watches", json={**spec, "source": "clip.mp4",
                                                     "webhook_url": "http://192.168.0.10/hook"})
        assert hook.status_code == 403 and "--allowed-webhook-networks" in hook.json()["error"]["message"]
    with make_local_server(allowed_webhook_networks=("192.168.0.0/16",)) as (url, _):
        hook = httpx.post(f"{url}/v1/watches", json={**spec, "source": "clip.mp4",
                                                     "webhook_url": "http://192.168.0.10/hook"})
        assert hook.status_code == 201
        httpx.delete(f"{url}/v1/watches/{hook.json()['id']}", timeout=60)


@pytest.fixture
def hls_files(tmp_path, make_test_video):
    """An HTTP server on every loopback address serving ``seg.ts`` and the playlist
    ``playlist(segment_url)`` writes; yields ``(playlist, port, requested paths)``."""
    path, _ = make_test_video(".ts", width=160, height=120, fps=8, duration_s=3.0, gop=8, bframes=False, seed=6)
    (tmp_path / "seg.ts").write_bytes(path.read_bytes())
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def do_GET(self):
            requested.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    with serving(Handler, "0.0.0.0") as port:
        def playlist(segment_url: str) -> str:
            (tmp_path / "list.m3u8").write_text("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:3\n"
                                                f"#EXTINF:3.0,\n{segment_url}\n#EXT-X-ENDLIST\n")
            return f"http://127.0.0.1:{port}/list.m3u8"

        yield playlist, port, requested


def test_an_hls_playlist_cannot_send_ffmpeg_to_another_private_host(hls_files):
    from vidsight.api.serve.stream_proxy import StreamProxy
    from vidsight.errors import VideoError
    from vidsight.ingest.stream import StreamSource

    playlist, port, requested = hls_files
    url = playlist(f"http://127.0.0.2:{port}/seg.ts")

    def frames(networks: str) -> int:
        proxy = StreamProxy(EgressRules("stream source", (ipaddress.ip_network(networks),)))
        try:
            return sum(1 for _ in StreamSource(url, fps=2.0, reconnect_tries=0,
                                               ffmpeg_options={"http_proxy": proxy.url}))
        except (VideoError, OSError):
            return 0
        finally:
            proxy.close()

    assert frames("127.0.0.1/32") == 0 and requested == ["/list.m3u8"]   # the camera's own host only
    assert frames("127.0.0.0/8") > 0 and requested[-1] == "/seg.ts"      # the same playlist, through the proxy


def test_a_redirect_from_an_allowed_host_to_a_private_one_is_refused_before_contact(counting_http):
    import asyncio

    from vidsight.api.serve.egress import send_checked

    port, seen = counting_http
    rules = EgressRules("webhook", (ipaddress.ip_network("127.0.0.1/32"),), flag="--allowed-webhook-networks")

    async def post(url):
        async with httpx.AsyncClient(follow_redirects=False, timeout=10) as client:
            response = await send_checked(client, "GET", url, rules)
            await response.aclose()
            return response.status_code

    assert asyncio.run(post(f"http://127.0.0.1:{port}/clip.mp4")) == 200
    with pytest.raises(EgressRefused, match="a loopback address refused.*--allowed-webhook-networks"):
        asyncio.run(post(f"http://127.0.0.1:{port}/to/http://127.0.0.2:{port}/clip.mp4"))
    with pytest.raises(EgressRefused, match="only http and https"):
        asyncio.run(post(f"http://127.0.0.1:{port}/to/file:///etc/passwd"))
    assert [path for path, _ in seen] == ["/clip.mp4", f"/to/http://127.0.0.2:{port}/clip.mp4", "/to/file:///etc/passwd"]
