"""mnist-scale-lab's helper package: the single source every notebook imports and every DDP worker runs.

The core (every notebook and worker; the notebook that introduces each module in brackets):
    paths        where data and results live (00)
    io           the one atomic writer: atomic_write, write_json(path, obj), atomic_save; MiB (00)
    data         offline MNIST with checksums; in-memory batches and the DataLoader route (00)
    models       the one model registry: Net (the article's), NetBN, FastNet, SpeedNet (00, 10)
    train        TrainConfig (and the workers' dashed flags), select_device, train_step (the one
                 training step), train_one_epoch, evaluate, fit (00, 02)
    distributed  rank and world size from the environment, backend choice, exact distributed evaluation (00, 06)
    worker       the one scaffold of the bench, beyond and bugs workers: process_group() (join, leave), finish()
                 (rank 0 prints and writes the JSON), parser(), @entry (11; the workers of 06 stay explicit)
    launch       torchrun from a notebook cell: live output, root causes, no orphans (00); child_env, the
                 environment of a fresh interpreter that finds the package (06, 12)
    ports        a free port, who holds one, holding one on purpose (07, 08)
    resources    the machine a result was measured on; usable_cores; gpu_count (counted without starting CUDA);
                 hardware and framework levels (00, 01)
    memory       peak memory on CPU and CUDA, a fresh process for RSS (run_isolated(fn)), is_oom; the batch-size
                 finder: find_batch_size, train_step_probe, limit_memory (05, 08)
    profiling    torch.profiler's labelled steps and their breakdown (profile_training, time_breakdown),
                 time_to_accuracy: what notebook 09 shares with the profile_ddp worker (09)
    experiments  the experiment log every notebook appends to (01)
The measurement harness of a notebook that a benchmark script runs at full size (the lesson and the script share it;
scripts import the core only):
    feeding        how fast batches reach the model: DataLoader vs in-memory uint8 tensors, feed_rates (03;
                   scripts/bench_loader.py)
    batch_scaling  04's fair batch-size sweep, its regime and the rules that judge it (04; scripts/bench_batch_scaling.py)
    precision      05's precision comparison, accumulation, allocator and empty_cache experiments (05;
                   scripts/bench_amp.py, scripts/device_check.py)
    scaling        07's weak and strong scaling, all-reduce sweeps and the ring model, DDP variants, restart trials
                   (07; scripts/bench_scaling.py, bench_allreduce.py, bench_restarts.py)
    speedrun       10's recipes, settings and ladders, the fixed-schedule protocol (fixed_schedule, its rows and
                   verdicts) and the first-crossing time_to_accuracy (10; scripts/bench_speedrun.py, device_check.py)
    claims       the article's claims (CATALOG), the result file every notebook writes (ResultFile), the load
                 rule (Contention, busy_verdict), spread(); `make claims` builds the README table from them (01)
    display      tables as pandas DataFrames: table(rows), show(rows, formats=...) (00)
    live         live training curves in a notebook; is an IPython kernel running (02)
    doctor       `python -m mnist_helpers.doctor`: checks a machine before a distributed run (08)
    hosted       the first cell of every notebook: the profile the machine picks (quick on <= 4 cores), writable
                 places outside a writable checkout, MNIST in place, no CUDA driver started (00)
    saved        GENERATED (`make saved`): the code notebooks write and mark #@save (04's scaled_lr,
                 warmup_factor, train_run, BASE_LR, BASE_BATCH; 10's hyp, hyp_995, shift), which their lessons
                 and scripts run (04, 10)
    exercises    the closing exercises of every notebook (00-12) and their checkers; `make exercises` writes
                 them into the notebooks and notebooks/solutions/
    series       the registry: one row per notebook (id, slug, lesson, core or appendix, runtimes), the
                 README's and INSTRUCTOR's tables are written from it (`make tables`)
    errors       expected errors (UsageError, ConfigError, PathError, SnapshotError) and @cli_entry, every
                 command's one error boundary: one message with the fix, exit code 2 (00)

Lessons: one module per notebook, built on the core, never importing each other:
    lessons/l00_setup             00  the damaged-file experiment's claim (claims_00)
    lessons/l01_resources         01  recommended settings per machine, framework and thread sweeps
    lessons/l02_baseline          02  the baseline's claims and the loop-vs-fit() comparison (claims_02)
    lessons/l03_dataloader        03  DataLoader sweeps, per-worker memory, the loader widget
    lessons/l04_batch_scaling     04  batch size x learning-rate rules, the batch explorer
    lessons/l05_precision_memory  05  autocast and GradScaler, accumulation, leaks, the CUDA allocator
    lessons/l06_ddp               06  the kernel-side demos: fork or spawn from a notebook, who starts CUDA; the
                                      learner's runs summarised and judged (claims_06)
    lessons/l07_scaling           07  weak and strong scaling, all-reduce sweeps, the ring model
    lessons/l08_troubleshooting   08  the article's errors reproduced and fixed, batch-size finder
    lessons/l09_profiling         09  torch.profiler breakdowns, autotune, the experience library
    lessons/l10_speedrun          10  recipes, time to accuracy
    lessons/l11_beyond_dp         11  checkpointing trade-off, per-rank memory rows, the memory explorer
    lessons/l12_ddp_in_depth      12  mp.spawn from a notebook, what init_process_group needs, DP vs DDP, the
                                      article's DDP details judged (claims_12)

Workers (run with torchrun or plain Python; each docstring has its commands; built on the core only, never on a
lesson or a tool: code a worker and a notebook share lives in the core):
    workers/progression/  single.py -> ddp_spawn.py -> ddp_train.py -> ft_train.py: one process, mp.spawn,
                          torchrun, fault tolerance (00, 12, 07)
    workers/demos/        12's demos (08 reuses them) behind one entry point (`-m mnist_helpers.workers.demos`,
                          `--demos ...`, common.py): manual_allreduce, local_rank_bug, sampler, seeding, syncbn, validation;
                          article_ddp.py: the article's 5.2 script as written (mp.spawn), run as a script
    workers/bugs/         08's reproductions, each with its --fix: port_in_use, local_rank, spawn_main,
                          unused_param, collective_mismatch, oom, eval_through_ddp, omp_threads; restart_kill
                          (07 and tests/test_restarts.py: a worker killed under torchrun --max-restarts)
    workers/bench/        benchmarks: allreduce (07), profile_ddp (09), accum_nosync (05)
    workers/exercises/    starters of the exercises that make the learner write code, each with a solution:
                          ddp_starter, ddp_solution (06-1: a single-device script made DDP); ft_starter,
                          ft_solution (07-3: add snapshot and resume); hang_starter, hang_solution (08-3: fix a hang);
                          local_rank_starter, local_rank_solution (12-1: read LOCAL_RANK); bucket_counter (06-2's
                          measurement: DDP's all-reduce calls per step)
    workers/beyond/       11's workers: sharding (DDP, ZeRO-1, FSDP2), dcp_checkpoint, tensor_parallel, compile_ddp,
                          pipelining; common.py (ResMLP, per-rank byte counts, step_peak)

Tools: tools/nbstrip (outputs out of git), tools/env_check (the install check), tools/bookkeeping (the share of notebook
code lines that only record results), tools/worker_diffs (the worker progression's diff rule and its rendered diffs, 06 and 12), tools/reaper (between the launcher and torchrun:
no worker outlives a killed kernel or a killed torchrun, 00).
"""

__version__ = "0.1.0"
