"""torchrun --max-restarts after a killed worker, measured: N trials per configuration, a success rate each.

Each trial runs ``mnist_helpers.workers.bugs.restart_kill`` (plain torch: a gloo group, rank 1 SIGKILLs itself
on the first attempt) under ``--max-restarts=2`` and counts it a success when the restarted group finishes.
The test runs the launcher's own settings (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) for ``--standalone`` (what
``mnist_helpers.launch.torchrun`` runs on one node) and for an explicit c10d endpoint (how several nodes meet),
prints both, writes them to ``results/restarts.json`` (claim ``07.restarts``) and asserts a behaviour: the
launcher's configuration restarts a killed worker. One trial per configuration (``TRIALS``): a trial shows the
mechanism (kill, restart, finish) and the test asserts nothing more; a *rate* needs many trials, which is the
benchmark's job: torch's defaults (store sharing on) and 10 trials per configuration,
``python scripts/bench_restarts.py --trials 10 --write`` (the reference in
``results/reference/<machine>/restarts.json``, what the claims table shows). The verdict's rule, which reads only
the trials and never the machine's load, is tested on given rows below.
"""
import pytest

from mnist_helpers.course import claims
from mnist_helpers.course.display import show
from mnist_helpers.lessons.n07 import scaling
from mnist_helpers.lessons.n07.scaling import RESTART_CONFIGS, RESTARTS_TABLE, restart_rates
from mnist_helpers.workers.bugs import restart_kill

TRIALS = 1  # per configuration: the mechanism, not a rate (the rate is scripts/bench_restarts.py's, 10 trials)
LAUNCHER_CONFIGS = [c for c in RESTART_CONFIGS if c[2] == "1"]  # store sharing off: standalone and c10d

pytestmark = pytest.mark.timeout(900)


@pytest.mark.process
def test_launcher_configuration_restarts_every_time(tmp_path):
    with claims.Contention() as busy:
        rows = restart_rates(TRIALS, LAUNCHER_CONFIGS, timeout=120)
    show(rows, **RESTARTS_TABLE)
    res = claims.ResultFile("restarts", profile="quick")
    entry = scaling.record_restarts(rows, res, contention=busy)
    assert not claims.unsourced_numbers(entry), entry
    res.write()
    for r in rows:
        print(f"{r['config']}: {r['succeeded']}/{r['trials']} restarts succeeded ({r['failures']})")
    for r in rows:  # both launcher configurations (standalone and an explicit c10d endpoint) restart
        assert r["succeeded"] == r["trials"] == TRIALS, r["runs"]
        assert all(run["restart_count"] == 1 for run in r["runs"])  # the restarted attempt is the one that finished
    assert entry["verdict"] == "holds" and entry["contention"] == busy.to_dict()


def test_the_verdict_reads_the_trials_not_the_machines_load():
    """07.restarts holds when every trial of the launcher's configuration restarted, whatever the load the trials
    ran under (recorded beside it); one failed trial of it is "does not hold here"; other configurations' failures
    (torch's defaults) are evidence, not the verdict."""
    mine = scaling.launcher_restart_config()

    def row(config, ok, trials=3):
        return {"config": config, "rendezvous": "standalone", "share_store_off": config == mine,
                "trials": trials, "succeeded": ok, "success_rate": ok / trials, "failures": {}, "runs": []}

    busy = {"others_cpu_share": 0.9, "load_avg_before": 4.0, "load_avg_after": 4.0, "cores": 2, "wall_s": 60,
            "busy": True}
    for ok, verdict in ((3, "holds"), (2, "does not hold here")):
        res = claims.ResultFile("restarts", profile="quick", folder=None)
        entry = scaling.record_restarts([row(mine, ok), row("torch default", 0)], res, contention=busy)
        assert entry["verdict"] == verdict and entry["contention"] == busy
        assert entry["numbers"]["launcher_succeeded"] == ok and "torch default: 0/3" in entry["evidence"]


@pytest.mark.process
def test_worker_runs_alone_and_rejects_nothing(tmp_path):
    """Plain Python: a world of one (torchrun's variables absent: init_process_group needs them, so it is given
    them), no kill because rank 0 is not the dying rank."""
    import os
    import subprocess
    import sys

    from mnist_helpers.ports import free_port

    out = tmp_path / "r.json"
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    p = subprocess.run([sys.executable, "-m", restart_kill.__name__, "--out", str(out)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert out.is_file()


def test_restart_command_shapes():
    assert "--standalone" in scaling.restart_command("standalone")
    cmd = scaling.restart_command("c10d", port=12345)
    assert "--rdzv-endpoint=127.0.0.1:12345" in cmd and "--max-restarts=2" in cmd
    with pytest.raises(ValueError, match="standalone"):
        scaling.restart_command("static")


@pytest.mark.process
def test_the_trials_are_a_script_and_the_worker_only_a_worker(tmp_path):
    """The rates over many trials are ``scripts/bench_restarts.py`` (it imports ``mnist_helpers.lessons.n07.scaling``); the
    worker being killed imports nothing of the series and takes no ``--trials``. Both refuse a bad command line
    before running anything."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_restarts.py"
    p = subprocess.run([sys.executable, str(script), "--trials", "0"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--trials must be a positive integer" in p.stderr, p.stderr[-2000:]
    p = subprocess.run([sys.executable, "-m", restart_kill.__name__, "--trials", "5"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "unrecognized arguments: --trials" in p.stderr, p.stderr[-2000:]
