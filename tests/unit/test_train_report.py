"""Scaling points, predictions and the training report, from made-up stored points."""
from __future__ import annotations

import pytest

from ddlcomm.report import train as report
from ddlcomm.results import Store
from ddlcomm.train import predict
from ddlcomm.train.scaling import scaling_points

LAYERS = [[0.02, 4000], [0.03, 400_000], [0.05, 40_000]]


def point(ranks, arch="allreduce", overlap=False, t_iter=0.2, peer="ddlcomm", batch=8):
    workers = ranks - 1 if arch == "ps" else ranks
    phases = {"io": 0.0, "h2d": 0.0, "forward": 0.05, "backward": 0.1, "update": 0.01,
              "comm_exposed": t_iter - 0.16, "comm_hidden": 0.0}
    return {
        "backend": "mpi", "library": "Open MPI", "collective": "train", "form": "buffer",
        "algorithm": "library", "dtype": "float32", "op": "avg", "bytes": 444_000, "count": 111_000,
        "ranks": ranks, "iterations": 10, "warmup": 2, "t_avg_us": t_iter * 1e6, "check": "passed",
        "extra": {"workload": "train", "phase": "iteration", "model": "smallcnn", "arch": arch,
                  "peer": peer, "overlap": overlap, "fusion": 25 << 20, "batch": batch,
                  "image_size": 32, "workers": workers, "threads": 1, "data": "synthetic",
                  "t_iter_s": t_iter, "phases_s": phases, "layers": LAYERS,
                  "comm_table": [[444_000, 0.02]], "images_per_s": workers * batch / t_iter,
                  "loss_first": 2.3, "loss_last": 1.9, "replicas_identical": True,
                  "t_iter_predicted_s": 0.18, "predicted_error": -0.1}}


def test_scaling_against_one_worker():
    pts = [point(1, t_iter=0.16), point(2, t_iter=0.2), point(4, t_iter=0.25),
           point(3, arch="ps", t_iter=0.4)]
    sc = {(p["extra"]["arch"], p["extra"]["workers"]): p["extra"] for p in scaling_points(pts)}
    assert sc[("allreduce", 1)]["speedup"] == pytest.approx(1.0)
    assert sc[("allreduce", 2)]["speedup"] == pytest.approx(2 * 0.16 / 0.2)
    assert sc[("allreduce", 4)]["efficiency"] == pytest.approx(0.16 / 0.25)
    assert sc[("ps", 2)]["speedup"] == pytest.approx(2 * 0.16 / 0.4)     # 2 workers + a server
    # one worker's phases + the comm measured at N: 0.16 s of work + 0.02 s exposed
    assert sc[("allreduce", 2)]["t_iter_predicted_from_1_s"] == pytest.approx(0.18)
    assert sc[("allreduce", 2)]["speedup_predicted"] == pytest.approx(2 * 0.16 / 0.18)


def test_ddp_scales_against_its_own_jobs_baseline():
    """DDP's points name its group's backend (Gloo beside mpi): they had no scaling row
    unless the job's --backend was gloo."""
    base, ddp = point(1, t_iter=0.16), point(2, t_iter=0.2, peer="ddp")
    base["run_id"] = ddp["run_id"] = 7
    ddp.update(backend="gloo", library="Gloo")
    ddp["extra"]["sync"] = "none"
    rows = scaling_points([base, ddp])
    got = {p["extra"]["peer"]: p["extra"] for p in rows}
    assert got["ddp"]["speedup"] == pytest.approx(2 * 0.16 / 0.2) and got["ddp"]["sync"] == "none"
    other_run = dict(ddp, run_id=8)
    assert [p["extra"]["peer"] for p in scaling_points([base, other_run])] == ["ddlcomm"]


def test_no_baseline_no_scaling_point():
    assert scaling_points([point(2), point(4)]) == []
    other = point(2)
    other["library"] = "MPICH"                      # a baseline of another library does not count
    assert [p["library"] for p in scaling_points([point(1), other, point(2)])] == ["Open MPI"] * 2


def test_predict_overlap_hides_communication():
    phases = {"io": 0.0, "h2d": 0.0, "forward": 0.05, "backward": 0.1, "update": 0.01}
    off = predict.predict(phases, LAYERS, 2, [[444_000, 0.02]], False, 25 << 20)
    on = predict.predict(phases, LAYERS, 2, [[444_000, 0.02]], True, 25 << 20)
    assert off["t_iter"] == pytest.approx(0.18) and off["exposed"] == pytest.approx(0.02)
    assert on["exposed"] == pytest.approx(0.02)     # one bucket ready at the end: nothing to hide
    per_tensor = predict.predict(phases, LAYERS, 2, [[4000, 0.001], [400_000, 0.018],
                                                     [40_000, 0.003]], True, 0)
    assert per_tensor["exposed"] < 0.02 and per_tensor["hidden"] > 0


def test_summary_and_page(tmp_path):
    pts = [point(1, t_iter=0.16), point(2, t_iter=0.2), point(2, overlap=True, t_iter=0.18),
           point(2, peer="ddp", t_iter=0.15), point(1, batch=16, t_iter=0.3)]
    pts += scaling_points(pts)
    text = report.render_summary(pts)
    assert "smallcnn b8 allreduce+overlap 25MiB" in text and "weak scaling" in text
    assert "identical" in text
    with Store(tmp_path / "r.db") as store:
        run_id = store.create_run({"command": "ddlcomm train"})
        for p in pts:
            store.add_point(run_id, p)
        stored, run = store.points(run_id), store.run(run_id)
    assert report.is_train_run(stored)
    page = report.write_train_report(run, stored, tmp_path / "out")
    html = page.read_text()
    assert "<svg" in html and "Weak scaling" in html and 'href="points.csv"' in html
    assert len((tmp_path / "out" / "points.csv").read_text().splitlines()) == len(stored) + 1
    for name in ("phases", "predicted", "scaling", "batch", "layers"):
        assert (tmp_path / "out" / f"{name}.png").exists(), name


def test_throughput_lines_start_at_their_own_runs_one_worker():
    """awan2019 draws GPU and CPU training of one library in one report: each line's
    one-worker baseline is its own run's, not the first one-rank point of the library."""
    from ddlcomm.report import train as tr

    def it(device, algorithm, overlap, ranks, ips, run):
        return dict(collective="train", phase="iteration", library="Open MPI", backend="mpi",
                    device=device, algorithm=algorithm, overlap=overlap, ranks=ranks, workers=ranks,
                    model="resnet50", batch=4, fusion=25 << 20, arch="allreduce", peer="ddlcomm",
                    images_per_s=ips, run_id=run, t_iter_s=1.0, check="passed")
    its = [it("cuda", "library", False, 1, 500.0, 14), it("cuda", "shm", False, 2, 900.0, 14),
           it("cuda", "shm", False, 4, 1500.0, 14), it("cpu", "library", False, 1, 10.0, 17),
           it("cpu", "library", True, 2, 15.0, 17), it("cpu", "library", True, 4, 20.0, 17)]
    lines = {l.get_label(): list(l.get_ydata()) for l in tr.throughput_figure(its).axes[0].get_lines()}
    assert lines["Open MPI resnet50 b4 allreduce+overlap 25MiB"] == [10.0, 15.0, 20.0]
    assert lines["Open MPI resnet50 b4 allreduce/shm 25MiB cuda"] == [500.0, 900.0, 1500.0]


def test_a_parameter_servers_one_worker_is_drawn_where_it_was_measured():
    """PS at 1 worker is 2 ranks (server + worker): its speed-up and throughput there are
    its own (slower than the one-rank baseline), not (1, 1.0) nor a jump from the baseline."""
    pts = [point(1, t_iter=0.16), point(2, t_iter=0.2), point(2, arch="ps", t_iter=0.25),
           point(3, arch="ps", t_iter=0.3)]
    pts += scaling_points(pts)
    ax = report.scaling_figure(pts).axes[0]
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    ps = lines["Open MPI smallcnn b8 ps 25MiB"]
    assert ps[0] == [1, 2] and ps[1] == [pytest.approx(0.16 / 0.25), pytest.approx(2 * 0.16 / 0.3)]
    assert lines["Open MPI smallcnn b8 allreduce 25MiB"][1][0] == pytest.approx(1.0)
    assert next(line for line in ax.get_lines() if line.get_label() == "ideal (linear)").get_linestyle() == ":"
    through = {line.get_label(): list(line.get_xdata())
               for line in report.throughput_figure(pts).axes[0].get_lines()}
    assert through["Open MPI smallcnn b8 ps 25MiB"] == [1, 2]          # no vertical jump at 1


def test_the_training_page_warns_as_a_run_page_does(tmp_path):
    """4 ranks on 2 cores on a busy machine, and nothing on the page said so."""
    pts = [point(1, t_iter=0.16), point(4, t_iter=0.3)]
    run = {"id": 3, "status": "passed", "command": "ddlcomm train",
           "load": {"ranks": 4, "usable_cores": 2, "wall_s": 9.0}}
    html = report.write_train_report(run, pts, tmp_path / "out").read_text()
    assert '<div class="warn"><b>Warning</b>' in html
    assert "oversubscribed: 4 ranks on 2 usable CPUs" in html


def test_the_batch_sweep_labels_batches_as_numbers():
    pts = [point(1, batch=b, t_iter=0.01 * b) for b in (16, 32, 64, 128)]
    ax = report.batch_figure(pts).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["16", "32", "64", "128"]
