"""Cluster files of notebook 07: the Slurm batch script and the Kubernetes manifests."""
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mnist_helpers.ports import free_port

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
K8S = REPO / "scripts" / "k8s"
pytestmark = pytest.mark.timeout(180)


def test_sbatch_shell_syntax_and_directives():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    text = SBATCH.read_text()
    assert "#SBATCH --ntasks-per-node=1" in text  # one torchrun agent per node
    assert "srun --ntasks-per-node=1 --kill-on-bad-exit=1" in text
    for piece in ('--nnodes "$SLURM_NNODES"', "--rdzv-backend c10d", '--rdzv-endpoint "$head:$port"'):
        assert piece in text


def sbatch_command(tmp_path, *worker_args, nodes=1):
    """The torchrun line the batch script builds, with SLURM_* faked and a stand-in `scontrol`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "scontrol"  # `scontrol show hostnames LIST` prints one host per line
    # many hosts: a `| head -n 1` in the script would die of SIGPIPE under pipefail (exit 141)
    fake.write_text("#!/bin/sh\necho localhost\nseq -f 'node%g' 2 20000\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "SLURM_JOB_NODELIST": "localhost,node2", "SLURM_NNODES": str(nodes), "SLURM_JOB_ID": "4242",
           "SLURM_CPUS_PER_TASK": "1", "RDZV_PORT": str(free_port()), "SNAPSHOT": str(tmp_path / "snap.pt")}
    out = subprocess.run(["bash", str(SBATCH), "--print-command", *worker_args], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    return shlex.split(out), env


def test_sbatch_builds_the_documented_torchrun_line(tmp_path):
    cmd, env = sbatch_command(tmp_path, "--epochs", "3", nodes=2)
    line = " ".join(cmd)
    assert cmd[0] == "torchrun"
    assert f"--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint localhost:{env['RDZV_PORT']}" in line
    assert "--rdzv-id 4242" in line and "-m mnist_helpers.workers.progression.ft_train" in line and line.endswith("--epochs 3")


def test_sbatch_refuses_outside_slurm():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    r = subprocess.run(["bash", str(SBATCH), "--print-command"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "SLURM_JOB_NODELIST" in r.stderr


def test_sbatch_command_runs_locally(tmp_path, mnist_root):
    """Exactly the line a node would run (one node here) trains and writes its results."""
    out = tmp_path / "result.json"
    cmd, env = sbatch_command(tmp_path, "--model", "fastnet", "--subset", "256", "--batch-size", "64",
                              "--test-subset", "500", "--out", str(out))
    r = subprocess.run(cmd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 1 and result["steps"] == 4 and (tmp_path / "snap.pt").is_file()


def load_yaml(name):
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (asked for in the dev extra)")
    return yaml.safe_load((K8S / name).read_text())


def test_trainjob_manifest():
    doc = load_yaml("trainjob.yaml")
    assert doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and doc["kind"] == "TrainJob"
    assert doc["spec"]["runtimeRef"]["name"] == "torch-distributed"
    trainer = doc["spec"]["trainer"]
    assert trainer["numNodes"] >= 2 and trainer["numProcPerNode"] >= 1 and trainer["image"]
    assert trainer["command"][0] == "torchrun" and "mnist_helpers.workers.progression.ft_train" in trainer["command"]
    assert any(a.startswith("--snapshot=") for a in trainer["args"])
    assert "nvidia.com/gpu" in trainer["resourcesPerNode"]["limits"]


def test_pytorchjob_manifest():
    doc = load_yaml("pytorchjob.yaml")
    assert doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "PyTorchJob"
    specs = doc["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"} and specs["Master"]["replicas"] == 1
    for role in specs.values():
        container = role["template"]["spec"]["containers"][0]
        assert container["name"] == "pytorch"  # the operator looks for this name
        assert container["command"][0] == "torchrun" and role["restartPolicy"] == "OnFailure"
