"""torchrun --max-restarts after a killed worker, measured: N trials per configuration, a success rate each.

Each trial runs ``mnist_helpers.workers.bugs.restart_kill`` (plain torch: a gloo group, rank 1 SIGKILLs itself
on the first attempt) under ``--max-restarts=2`` and counts it a success when the restarted group finishes.
The test runs the launcher's own settings (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) for ``--standalone`` (what
``mnist_helpers.launch.torchrun`` runs on one node) and for an explicit c10d endpoint (how several nodes meet),
prints both rates, writes them to ``results/restarts.json`` (claim ``07.restarts``) and asserts a behaviour: the
launcher's configuration restarts every time. torch's defaults (store sharing on) and more trials:
``python scripts/bench_restarts.py --trials 10 --write`` (the reference in
``results/reference/<machine>/restarts.json``).
"""
import pytest

from mnist_helpers import claims
from mnist_helpers.display import show
from mnist_helpers.lessons import l07_scaling as scaling
from mnist_helpers.lessons.l07_scaling import RESTART_CONFIGS, RESTARTS_TABLE, restart_rates
from mnist_helpers.workers.bugs import restart_kill

TRIALS = 5
LAUNCHER_CONFIGS = [c for c in RESTART_CONFIGS if c[2] == "1"]  # store sharing off: standalone and c10d

pytestmark = pytest.mark.timeout(900)


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
    mine = next(r for r in rows if r["config"] == scaling.launcher_restart_config())
    assert mine["succeeded"] == mine["trials"] == TRIALS, mine["runs"]
    assert entry["verdict"] == "holds"
    assert all(run["restart_count"] == 1 for run in mine["runs"])  # the restarted attempt is the one that finished


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


def test_the_trials_are_a_script_and_the_worker_only_a_worker(tmp_path):
    """The rates over many trials are ``scripts/bench_restarts.py`` (it imports ``mnist_helpers.scaling``); the
    worker being killed imports nothing of the series and takes no ``--trials``. Both refuse a bad command line
    before running anything."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_restarts.py"
    p = subprocess.run([sys.executable, str(script), "--trials", "0"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--trials must be a positive integer" in p.stderr, p.stderr[-2000:]
    p = subprocess.run([sys.executable, "-m", restart_kill.__name__, "--trials", "5"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "unrecognized arguments: --trials" in p.stderr, p.stderr[-2000:]
