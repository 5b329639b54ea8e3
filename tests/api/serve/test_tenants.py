"""Keys per tenant: each sees and stops only its own watches and sessions, an admin all; per-key
limits answered 429 with the limit named; keys compared in constant time and never shown."""

import secrets

import httpx
import pytest

from vidsight.api.serve.tenants import ApiKey, RequestCounter, Tenant, identify, read_api_keys
from vidsight.errors import ConfigError

pytestmark = pytest.mark.slow

KEYS = {"alice": "alice-key-0001", "bob": "bob-key-00002", "root": "root-key-0003"}
WATCH = {"source": "long.mp4", "query": "Is it red?", "window_s": 4.0, "stride": 0.5, "fps": 2.0, "realtime": True}


def auth(name: str) -> dict:
    return {"Authorization": f"Bearer {KEYS[name]}"}


@pytest.fixture
def keys_file(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# name key options\n"
                    f"alice {KEYS['alice']} watches=1 sessions=1 requests=2\n"
                    f"bob   {KEYS['bob']}\n\n"
                    f"root  {KEYS['root']} admin   # sees everything\n")
    return path


def test_the_keys_file_is_read_and_its_errors_name_the_line_not_the_key(keys_file, tmp_path):
    keys = read_api_keys(keys_file)
    assert [k.tenant for k in keys] == [Tenant("alice", max_watches=1, max_sessions=1, max_requests=2),
                                        Tenant("bob"), Tenant("root", admin=True)]
    assert KEYS["alice"] not in repr(keys)
    for text, message in ((f"alice {KEYS['alice']} watches=0\n", "line 1: unknown option 'watches=0'"),
                          ("alice\n", "line 1: expected"), ("alice short\n", "shorter than 8"),
                          (f"alice {KEYS['alice']}\nalice {KEYS['bob']}\n", "named twice"),
                          (f"alice {KEYS['alice']}\nbob {KEYS['alice']}\n", "share a key")):
        bad = tmp_path / "bad"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message) as caught:
            read_api_keys(bad)
        assert KEYS["alice"] not in str(caught.value) and KEYS["bob"] not in str(caught.value)


def test_every_key_is_compared_whichever_matches(monkeypatch):
    compared = []
    real = secrets.compare_digest
    monkeypatch.setattr(secrets, "compare_digest", lambda a, b: compared.append(b) or real(a, b))
    keys = tuple(ApiKey(Tenant(name), key) for name, key in KEYS.items())
    assert identify(keys, f"Bearer {KEYS['alice']}") == Tenant("alice")
    assert identify(keys, "Bearer nobody-at-all") is None
    assert len(compared) == 2 * len(KEYS)


def test_a_tenant_past_its_requests_in_progress_gets_429():
    from vidsight.api.serve.media import RequestError

    counter, tenant = RequestCounter(), Tenant("alice", max_requests=2)
    with counter.admit(tenant), counter.admit(tenant):
        with pytest.raises(RequestError, match="requests=2") as refused:
            with counter.admit(tenant):
                pass
        assert refused.value.status == 429
        with counter.admit(Tenant("bob", max_requests=1)):   # others are counted apart
            pass
    with counter.admit(tenant):   # places come back
        pass


def test_n_answers_count_as_n_requests_and_n_places(make_local_server, keys_file, media):
    """A completion's n answers hold n of the server's places and count as n of its tenant's
    requests (alice may have 2 in progress), so n cannot multiply what a tenant may run."""
    from vidsight.api.serve.media import RequestError

    counter, tenant = RequestCounter(), Tenant("alice", max_requests=2)
    with counter.admit(tenant):
        with pytest.raises(RequestError, match="requests=2.*2 more wanted"):
            with counter.admit(tenant, 2):
                pass
        with counter.admit(tenant, 1):
            pass
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": str(media / "clip.mp4")}}, {"type": "text", "text": "Colour?"}]}]}
    with make_local_server(api_keys=read_api_keys(keys_file), max_concurrent=4) as (url, _):
        answered = [httpx.post(f"{url}/v1/chat/completions", json={**body, "n": n}, headers=auth("alice"), timeout=60)
                    for n in (2, 3)]
        crowded = httpx.post(f"{url}/v1/chat/completions", json={**body, "n": 5}, headers=auth("bob"), timeout=60)
    assert answered[0].status_code == 200 and len(answered[0].json()["choices"]) == 2
    assert answered[1].status_code == 429 and "requests=2" in answered[1].json()["error"]["message"]
    assert crowded.status_code == 429 and "5 wanted for n=5" in crowded.json()["error"]["message"]


def test_tenants_see_and_stop_only_their_own_watches_and_sessions(make_local_server, keys_file, long_video):
    with make_local_server(api_keys=read_api_keys(keys_file)) as (url, _):
        mine = httpx.post(f"{url}/v1/watches", json=WATCH, headers=auth("alice"))
        assert mine.status_code == 201 and mine.json()["tenant"] == "alice"
        watch = mine.json()["id"]
        session = httpx.post(f"{url}/v1/sessions", json={"source": "long.mp4", "fps": 1.0, "realtime": True},
                             headers=auth("alice"))
        assert session.status_code == 201
        session = session.json()["id"]
        for method, path in (("GET", f"/v1/watches/{watch}"), ("GET", f"/v1/watches/{watch}/verdicts"),
                             ("GET", f"/v1/watches/{watch}/events"), ("GET", f"/v1/watches/{watch}/frame.jpg"),
                             ("DELETE", f"/v1/watches/{watch}"), ("GET", f"/v1/sessions/{session}"),
                             ("POST", f"/v1/sessions/{session}/messages"), ("DELETE", f"/v1/sessions/{session}")):
            answer = httpx.request(method, f"{url}{path}", headers=auth("bob"), timeout=60,
                                   json={"question": "What colour?"} if method == "POST" else None)
            assert answer.status_code == 404, (method, path)
        assert httpx.get(f"{url}/v1/watches", headers=auth("bob")).json()["data"] == []
        assert httpx.get(f"{url}/v1/sessions", headers=auth("bob")).json()["data"] == []
        assert [w["id"] for w in httpx.get(f"{url}/v1/watches", headers=auth("root")).json()["data"]] == [watch]
        assert [s["id"] for s in httpx.get(f"{url}/v1/sessions", headers=auth("root")).json()["data"]] == [session]
        # alice's limits: one watch, one session
        second = httpx.post(f"{url}/v1/watches", json=WATCH, headers=auth("alice"))
        assert second.status_code == 429 and "watches=1" in second.json()["error"]["message"]
        second = httpx.post(f"{url}/v1/sessions", json={"source": "long.mp4"}, headers=auth("alice"))
        assert second.status_code == 429 and "sessions=1" in second.json()["error"]["message"]
        assert httpx.post(f"{url}/v1/watches", json=WATCH, headers=auth("bob")).status_code == 201
        # the admin stops alice's; then alice may start another
        assert httpx.delete(f"{url}/v1/watches/{watch}", headers=auth("root"), timeout=60).status_code == 200
        assert httpx.delete(f"{url}/v1/sessions/{session}", headers=auth("root"), timeout=60).status_code == 200
        assert httpx.post(f"{url}/v1/watches", json=WATCH, headers=auth("alice")).status_code == 201
        assert httpx.get(f"{url}/v1/watches", headers={"Authorization": "Bearer nope"}).status_code == 401
        for record in httpx.get(f"{url}/v1/watches", headers=auth("root")).json()["data"]:
            httpx.delete(f"{url}/v1/watches/{record['id']}", headers=auth("root"), timeout=60)
