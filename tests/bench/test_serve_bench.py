"""`bench serve` against a server on loopback: completions and real-time watches, no errors."""

import json
from pathlib import Path

import pytest

from vidsight.api.cli import main

pytestmark = pytest.mark.slow


def test_bench_serve_runs_completions_and_watches(tmp_path, tiny_model_dir, make_test_video, capsys):
    video, _ = make_test_video(width=160, height=120, fps=8, duration_s=8.0, gop=16, bframes=False, seed=4)
    code = main(["bench", "serve", "--model", str(tiny_model_dir), "--device", "cpu", "--video", str(video),
                 "--concurrency", "1", "2",
                 "--requests", "2", "--watches", "2", "--window", "4", "--out", str(tmp_path), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert [level["concurrency"] for level in report["completions"]] == [1, 2]
    assert all(level["errors"] == 0 and level["requests"] == 2 for level in report["completions"])
    assert report["mixed"]["completions"]["errors"] == 0
    watches = report["mixed"]["watches"]
    assert len(watches) == 2 and all(w["windows"] >= 5 and w["error"] is None for w in watches)
    assert all(0.5 < w["realtime_factor"] < 2 for w in watches)
    assert (tmp_path / "serve.png").stat().st_size > 0


def test_bench_serve_on_ray_loads_a_deployment(tmp_path, tiny_model_dir, make_test_video):
    import subprocess
    import sys

    # One replica count and no watch: two replicas and watches on Ray are the stream-pinning
    # test's (tests/api/serve/test_ray.py); each further count adds a deployment's 12 s here.
    video, _ = make_test_video(width=160, height=120, fps=8, duration_s=2.0, gop=16, bframes=False, seed=4)
    # A process of its own: Ray allows one instance per driver, and the API tests may hold theirs.
    command = ["from vidsight.api.cli import main; raise SystemExit(main())", "bench", "serve", "--ray",
               "--replicas", "1", "--model", str(tiny_model_dir), "--device", "cpu", "--video", str(video),
               "--concurrency", "2", "--requests", "2", "--watches", "0", "--out", str(tmp_path),
               "--json"]
    done = subprocess.run([sys.executable, "-c", *command], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.splitlines()[-1])
    (row,) = report["scaling"]
    assert row["replicas"] == 1 and row["errors"] == 0 and row["watch_realtime_factors"] == []
    assert row["projected_requests_per_s"] == report["per_replica_requests_per_s"] == row["requests_per_s"] > 0
    assert (tmp_path / "serve_ray.png").stat().st_size > 0


def test_the_scaling_report_projects_one_replicas_throughput_per_host():
    from vidsight.bench.serve_scaling import format_scaling_report, scaling_report

    def run(replicas, per_s):
        level = {"concurrency": 4, "requests_per_s": per_s, "errors": 0, "ttft_s": {"p50": 0.1},
                 "e2e_s": {"p50": 1.0 / per_s}}
        return {"replicas": replicas, "completions": [level], "mixed": {"watches": [{"realtime_factor": 0.9}]}}

    report = scaling_report([run(1, 3.0), run(2, 5.0), run(4, 7.0)])
    assert report["per_replica_requests_per_s"] == 3.0
    assert [row["projected_requests_per_s"] for row in report["scaling"]] == [3.0, 6.0, 12.0]
    assert [row["requests_per_s"] for row in report["scaling"]] == [3.0, 5.0, 7.0]
    # Without a one-replica run there is nothing to project from.
    assert scaling_report([run(2, 5.0)])["scaling"][0]["projected_requests_per_s"] is None
    assert "12.00" in format_scaling_report(report)


def test_a_short_soak_gives_back_what_the_server_took(tmp_path, tiny_model_dir):
    """Every kind of client ran, nothing answered 5xx, and the server's descriptors, threads and
    temporary entries are back to their warm-up counts once the load is over."""
    from vidsight.bench.soak import run_soak
    from vidsight.bench.watch import anomaly_videos

    videos = [Path(v["video"]) for v in anomaly_videos(tmp_path / "videos", 2)]
    report = run_soak(12, str(tiny_model_dir), videos, "cpu", settle_s=3)
    kinds = {key.rsplit(" ", 1)[0] for key in report["statuses"]}
    assert {"completion", "watch", "events", "session", "message", "close session"} <= kinds
    assert any(key.startswith("malformed") and key.endswith(("403", "422")) for key in report["statuses"])
    assert report["server_errors"] == []
    warm, end = report["warm"], report["end"]
    assert end["fds"] <= warm["fds"] and end["threads"] <= warm["threads"] and end["temp_entries"] == 0


def test_a_soak_server_whose_free_port_is_taken_before_it_binds_starts_on_another(tmp_path, tiny_model_dir,
                                                                                  monkeypatch):
    """The port found free can be taken before `vidsight serve` binds it (it then exits: "address
    already in use"); the soak's server is started again on another port."""
    import socket
    import types

    import httpx

    from vidsight.bench import soak

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    probes = []

    class FirstProbeFindsTheTakenPort(socket.socket):
        def getsockname(self):
            probes.append(True)
            return taken.getsockname() if len(probes) == 1 else super().getsockname()

    monkeypatch.setattr(soak, "socket", types.SimpleNamespace(socket=FirstProbeFindsTheTakenPort))
    with taken, soak._server(str(tiny_model_dir), tmp_path, tmp_path / "serve.db", tmp_path, "cpu") as (url, _):
        assert httpx.get(f"{url}/health").status_code == 200
        assert url != f"http://127.0.0.1:{taken.getsockname()[1]}" and len(probes) == 2
