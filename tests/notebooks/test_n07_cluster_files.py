"""Cluster files of notebook 07: the Slurm batch script and the Kubernetes manifests."""
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mnist_helpers.ports import free_port

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
K8S = REPO / "scripts" / "k8s"
pytestmark = pytest.mark.timeout(180)


@pytest.mark.process
def test_sbatch_shell_syntax_and_directives():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    text = SBATCH.read_text()
    assert "#SBATCH --ntasks-per-node=1" in text  # one torchrun agent per node
    srun = [line for line in text.splitlines() if line.startswith("srun ")]
    assert len(srun) == 1 and srun[0].startswith("srun --ntasks-per-node=1 --kill-on-bad-exit=1")
    # Slurm >= 22.05: srun does not inherit --cpus-per-task from the job; without it torchrun gets 1 CPU
    assert '--cpus-per-task="${SLURM_CPUS_PER_TASK' in srun[0]
    assert "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK" in text
    for piece in ('--nnodes "$SLURM_NNODES"', "--rdzv-backend c10d", '--rdzv-endpoint "$head:$port"'):
        assert piece in text
    # GPUs: read from what Slurm allocated, not promised by a commented-out directive
    assert not [line for line in text.splitlines() if "#SBATCH --gpus" in line or "#SBATCH --gres" in line]
    assert "SLURM_GPUS_ON_NODE" in text and "SLURM_JOB_GPUS" in text


def fake_slurm(tmp_path, nodes=1, **extra):
    """SLURM_* faked for the batch script, with a stand-in `scontrol` (and `srun`: it records its arguments)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "scontrol"  # `scontrol show hostnames LIST` prints one host per line
    # many hosts: a `| head -n 1` in the script would die of SIGPIPE under pipefail (exit 141)
    fake.write_text("#!/bin/sh\necho localhost\nseq -f 'node%g' 2 20000\n")
    fake.chmod(0o755)
    srun = bin_dir / "srun"  # what the step would get: its options and SRUN_CPUS_PER_TASK
    srun.write_text(f"#!/bin/sh\necho \"SRUN_CPUS_PER_TASK=$SRUN_CPUS_PER_TASK $*\" > {tmp_path}/srun.txt\n")
    srun.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SRUN_")) and k != "NPROC_PER_NODE"}
    env.update({"PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
                "SLURM_JOB_NODELIST": "localhost,node2", "SLURM_NNODES": str(nodes), "SLURM_JOB_ID": "4242",
                "SLURM_CPUS_PER_TASK": "1", "RDZV_PORT": str(free_port()), "SNAPSHOT": str(tmp_path / "snap.pt"),
                **extra})
    return env


def sbatch_command(tmp_path, *worker_args, nodes=1, **extra):
    """The torchrun line the batch script builds, with SLURM_* faked and a stand-in `scontrol`."""
    env = fake_slurm(tmp_path, nodes, **extra)
    out = subprocess.run(["bash", str(SBATCH), "--print-command", *worker_args], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    return shlex.split(out), env


@pytest.mark.process
def test_srun_gives_the_node_task_every_cpu_of_the_job(tmp_path):
    """The finding: srun (Slurm >= 22.05) does not take --cpus-per-task from sbatch, so torchrun and all its workers
    ran on 1 CPU. The script's srun step gets the job's CPUs per task, by option and by SRUN_CPUS_PER_TASK."""
    env = fake_slurm(tmp_path, SLURM_CPUS_PER_TASK="8")
    r = subprocess.run(["bash", str(SBATCH), "--epochs", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    srun = (tmp_path / "srun.txt").read_text().split()
    assert srun[0] == "SRUN_CPUS_PER_TASK=8" and "--cpus-per-task=8" in srun
    assert srun[srun.index("--cpus-per-task=8") + 1] == "torchrun"  # an srun option, before the command
    assert "(0 GPUs and 8 CPUs per node)" in r.stdout


@pytest.mark.process
@pytest.mark.parametrize("gpu_env, want", [
    ({"SLURM_GPUS_ON_NODE": "4"}, 4),                              # sbatch --gpus-per-node=4: one worker per GPU
    ({"SLURM_JOB_GPUS": "0,1"}, 2),                                # only the GPU indices: counted
    ({"SLURM_GPUS_ON_NODE": "2", "NPROC_PER_NODE": "2"}, 2),       # asked for and matching
    ({"NPROC_PER_NODE": "3"}, 3),                                  # no GPU allocated: workers on the CPUs
    ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, 1),                        # the submitting shell's, not an allocation
])
def test_sbatch_starts_one_worker_per_allocated_gpu(tmp_path, gpu_env, want):
    cmd, _ = sbatch_command(tmp_path, **gpu_env)
    assert cmd[cmd.index("--nproc-per-node") + 1] == str(want)


@pytest.mark.process
@pytest.mark.parametrize("nproc, gpus, says", [("2", "4", "2 would sit idle"), ("8", "4", "share a GPU")])
def test_sbatch_refuses_workers_that_do_not_match_the_gpus(tmp_path, nproc, gpus, says):
    env = fake_slurm(tmp_path, NPROC_PER_NODE=nproc, SLURM_GPUS_ON_NODE=gpus)
    for args in (["--print-command"], []):  # before printing anything, before starting anything
        r = subprocess.run(["bash", str(SBATCH), *args], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr and f"--gpus-per-node={nproc}" in r.stderr, r.stderr
        assert not r.stdout and not (tmp_path / "srun.txt").exists()


@pytest.mark.process
def test_sbatch_builds_the_documented_torchrun_line(tmp_path):
    cmd, env = sbatch_command(tmp_path, "--epochs", "3", nodes=2)
    line = " ".join(cmd)
    assert cmd[0] == "torchrun"
    assert f"--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint localhost:{env['RDZV_PORT']}" in line
    assert "--rdzv-id 4242" in line and "-m mnist_helpers.workers.progression.ft_train" in line and line.endswith("--epochs 3")


@pytest.mark.process
def test_sbatch_refuses_outside_slurm():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    r = subprocess.run(["bash", str(SBATCH), "--print-command"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "SLURM_JOB_NODELIST" in r.stderr


@pytest.mark.process
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
    master = specs["Master"]["template"]["spec"]["containers"][0]
    assert [p["name"] for p in master["ports"]] == ["pytorchjob-port"]  # what MASTER_PORT is taken from


def pods(doc) -> list[tuple[dict, dict]]:
    """(pod spec, training container) of every pod kind a manifest makes; TrainJob: the runtime patch of `node`."""
    if doc["kind"] == "PyTorchJob":
        return [(r["template"]["spec"], r["template"]["spec"]["containers"][0])
                for r in doc["spec"]["pytorchReplicaSpecs"].values()]
    patches = [rj for p in doc["spec"]["runtimePatches"]
               for rj in p["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"] if rj["name"] == "node"]
    assert len(patches) == 1, "one patch of the runtime's replicated job `node`"
    spec = patches[0]["template"]["spec"]["template"]["spec"]
    node = [c for c in spec["containers"] if c["name"] == "node"]
    assert node, "the patch mounts into the runtime's container `node`"
    return [(spec, node[0])]


def torchrun_flags(doc) -> dict[str, str]:
    cmd = doc["spec"]["trainer"]["command"] if doc["kind"] == "TrainJob" else pods(doc)[0][1]["command"]
    args = cmd[1:cmd.index("-m")]
    assert all(a.startswith("--") and "=" in a for a in args), args  # --flag=value, one item each
    return dict(a.split("=", 1) for a in args)


@pytest.mark.parametrize("name, addr", [("pytorchjob.yaml", "$(MASTER_ADDR):$(MASTER_PORT)"),
                                        ("trainjob.yaml", "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)")])
def test_manifests_use_c10d_rendezvous_on_the_first_pod(name, addr):
    """The finding: torchrun's default static rendezvous fixes ranks at start, so a restarted pod or worker group
    cannot regroup. c10d, hosted by the first pod at the address the operator sets, in every pod's command."""
    doc = load_yaml(name)
    flags = torchrun_flags(doc)
    assert flags["--rdzv-backend"] == "c10d" and flags["--rdzv-endpoint"] == addr and flags["--rdzv-id"]
    assert int(flags["--max-restarts"]) >= 1
    if doc["kind"] == "PyTorchJob":  # Master and Worker: the same rendezvous
        assert len({tuple(c["command"]) for _, c in pods(doc)}) == 1


@pytest.mark.parametrize("name", ["pytorchjob.yaml", "trainjob.yaml"])
def test_every_pod_mounts_the_shared_snapshot_claim(name):
    """The finding: /snapshots without a volume is each pod's own empty folder: a restarted pod starts over and ranks
    on different pods see different files. Every pod mounts one ReadWriteMany claim there, defined beside."""
    doc = load_yaml(name)
    claim = load_yaml("snapshots-pvc.yaml")
    assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
    text = (K8S / name).read_text()
    assert "snapshots-pvc.yaml" in text  # the header says to apply the claim first
    command = doc["spec"]["trainer"]["args"] if doc["kind"] == "TrainJob" else pods(doc)[0][1]["command"]
    snapshot = next(a.split("=", 1)[1] for a in command if a.startswith("--snapshot="))
    for spec, container in pods(doc):
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        (vol_name,) = [n for n, path in mounts.items() if path == "/snapshots"]
        assert snapshot.startswith("/snapshots/")
        assert volumes[vol_name]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
