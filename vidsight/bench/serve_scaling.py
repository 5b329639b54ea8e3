"""`vidsight bench serve --ray`: the same load against Ray Serve deployments of 1, 2, ... replicas.

Each replica count gets a fresh deployment and the whole `run_serve_bench` load. On one machine the
replicas share its cores with the HTTP proxy, the gateway and the load generator, so what the
figures show is routing overhead and how far one host's cores scale; across hosts, replicas share
nothing (each keeps its own streams, as Mosaic scales data-parallel), so the projection multiplies
the throughput one replica sustains by the number of hosts.
"""

from __future__ import annotations

from pathlib import Path

from vidsight.bench.report import save_figure, write_report


def scaling_report(runs: list[dict]) -> dict:
    """``runs``: ``{"replicas": n, **run_serve_bench report}`` per count; adds the measured and
    projected throughput at the highest concurrency."""
    rows = []
    single = next((run for run in runs if run["replicas"] == 1), None)
    per_replica = single["completions"][-1]["requests_per_s"] if single else None
    for run in runs:
        top = run["completions"][-1]
        rows.append({"replicas": run["replicas"], "concurrency": top["concurrency"],
                     "requests_per_s": top["requests_per_s"], "errors": sum(c["errors"] for c in run["completions"]),
                     "ttft_p50_s": top["ttft_s"]["p50"], "e2e_p50_s": top["e2e_s"]["p50"],
                     "e2e_p50_at_1_s": run["completions"][0]["e2e_s"]["p50"],
                     "projected_requests_per_s": per_replica * run["replicas"] if per_replica else None,
                     "watch_realtime_factors": [w["realtime_factor"] for w in run["mixed"]["watches"]]})
    return {"runs": runs, "scaling": rows, "per_replica_requests_per_s": per_replica}


def format_scaling_report(report: dict) -> str:
    lines = ["replicas  requests/s  projected (one host each)  e2e p50 s at 1 / at top  errors  watch RT factors"]
    for row in report["scaling"]:
        projected = "-" if row["projected_requests_per_s"] is None else f"{row['projected_requests_per_s']:.2f}"
        factors = ", ".join(f"{f:.3f}" for f in row["watch_realtime_factors"] if f is not None) or "-"
        lines.append(f"{row['replicas']:8d}  {row['requests_per_s']:10.2f}  {projected:>25}  "
                     f"{row['e2e_p50_at_1_s']:11.2f} / {row['e2e_p50_s']:6.2f}  {row['errors']:6d}  {factors}")
    return "\n".join(lines)


def write_scaling_report(report: dict, out: str | Path) -> tuple[Path, Path]:
    return write_report(report, out, "serve_ray", _plot)


def _plot(report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6, 4))
    rows = report["scaling"]
    xs = [row["replicas"] for row in rows]
    axis.plot(xs, [row["requests_per_s"] for row in rows], "o-", label="measured (this machine)")
    if report["per_replica_requests_per_s"]:
        axis.plot(xs, [row["projected_requests_per_s"] for row in rows], "s--", label="projected (a host each)")
    axis.set_xlabel("replicas")
    axis.set_ylabel(f"chat completions per second (concurrency {rows[-1]['concurrency']})")
    axis.set_xticks(xs)
    axis.legend()
    return save_figure(fig, path)
